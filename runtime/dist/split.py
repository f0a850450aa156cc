"""A training step split at the optimizer, so gradients can be all-reduced (or reduce-scattered) in between.

    grads = GradientStep(train_graph, backend)           # forward + loss + backward on the rank's backend
    loss, g = grads.run(inputs)                           # host arrays, keyed by parameter name
    opt = OptimizerStep(train_graph)                     # the optimizer nodes, on the host (numpy)
    new = opt.run(reduced_g); grads.set_parameters(new)
    buf, part = pack_shards(shards, flat)                # ZeRO: rank r's parameters in part r of one buffer
    unpack_shard(buf[r * part:(r + 1) * part], shards[r], shapes)

Both halves come from one `build_train_graph` (runtime/train/step.py): its nodes carry a phase, and
everything before the first 'optimizer' node is the joint forward/backward. Parameters travel between
the halves by name, so a gradient step re-captured for a new row count (re-balancing) plugs into the
same optimizer and its state.

Why the optimizer runs on the host with the numpy kernels on every rank: the ranks of a hybrid run
sit on different backends whose optimizer kernels agree only to the last bit or so (torch fuses
multiply-adds, numpy does not). Identical all-reduced gradients through one implementation give
bit-identical parameters on every rank, which is the data-parallel contract; the gradients are on the
host anyway for the gloo all-reduce.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import backends
from ..executor import Executor, compile_plan
from ..graph import Graph, Ref
from ..hdi import Backend
from ..train.joint import phase_of
from ..train.step import TrainGraph


def _subgraph(g: Graph, nodes, inputs, outputs) -> Graph:
    nodes = [dataclasses.replace(n, index=i) for i, n in enumerate(nodes)]
    read = {s for n in nodes for s in n.inputs}
    consts = {s: v for s, v in g.constant_slots.items() if s in read}
    return Graph(nodes, g.num_slots, list(inputs), consts, [Ref(s) for s in outputs], g.slot_meta, g.model_name)


class GradientStep:
    """Forward, loss and backward of one rank's rows; returns the loss and the gradients."""

    def __init__(self, train: TrainGraph, backend: Backend, *, allow_fallback: bool = True):
        g, joint = train.graph, train.joint
        nodes = [n for n in g.nodes if phase_of(n) != "optimizer"]
        self.names = [n for n in joint.param_slots if n in joint.grad_slots]
        self.param_slots = joint.param_slots
        outs = [joint.loss_slot] + [joint.grad_slots[n] for n in self.names]
        buffers = {joint.buffer_slots[n]: s for n, s in joint.buffer_updates.items()}
        self.graph = _subgraph(g, nodes, g.input_slots, outs + list(buffers.values()))
        self.backend = backend
        self.plan = compile_plan(self.graph, backend, allow_fallback=allow_fallback, carry=buffers)
        self.executor = Executor(self.plan)

    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        """New parameter values (host arrays) onto the backends that read them."""
        for name, slot in self.param_slots.items():
            b = self.plan.constant_backend.get(slot)
            if b is not None and name in params:
                self.plan.constants[slot] = b.memory.to_device(params[name])

    def run(self, inputs: tuple) -> tuple[float, dict[str, np.ndarray]]:
        outs = self.executor.run(*inputs)
        refs = self.plan.output_refs
        host = [np.asarray(self.executor.holder(r.slot).memory.to_host(v)) for r, v in zip(refs, outs)]
        return float(host[0]), dict(zip(self.names, host[1:1 + len(self.names)]))


class OptimizerStep:
    """The optimizer nodes of a TrainGraph as their own plan (on the host's numpy kernels unless a
    backend is given: `opscope simulate` times them on the chip); keeps parameters and state."""

    def __init__(self, train: TrainGraph, backend: Backend | None = None, shard: list[str] | None = None):
        """shard: only these parameters' updates and optimizer state (ZeRO-1: each rank one shard)."""
        g, joint = train.graph, train.joint
        self.names = [n for n in joint.param_slots if n in joint.grad_slots and (shard is None or n in shard)]
        keep = set(self.names)
        # an optimizer node carries the parameter it updates; one without (adamw's step count) serves all
        nodes = [n for n in g.nodes if phase_of(n) == "optimizer" and n.attrs.get("param", None) in keep | {None}]
        grad_slots = [joint.grad_slots[n] for n in self.names]
        others = {joint.param_slots[n] for n in joint.param_slots if n not in keep} | \
            {b for n, bufs in train.state_slots.items() if n not in keep for b in bufs}
        carry = {c: o for c, o in train.carry.items() if c not in joint.buffer_slots.values() and c not in others}
        self.state_slots = [b for n in self.names for b in train.state_slots.get(n, [])]
        self.graph = _subgraph(g, nodes, grad_slots, list(carry.values()))
        self.plan = compile_plan(self.graph, backend or backends.resolve("numpy"), carry=carry)
        self.executor = Executor(self.plan)
        self.param_slots = joint.param_slots
        self.captured = g.constant_slots

    def state_bytes(self) -> int:
        """Bytes of optimizer state this step keeps (momentum, Adam's moments): what ZeRO-1 divides."""
        total = 0
        for slot in self.state_slots:
            value = self.plan.constants.get(slot)
            if value is not None:
                total += int(np.asarray(self.plan.constant_backend[slot].memory.to_host(value)).nbytes)
        return total

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter (name -> host array): updated ones from the plan, the others as captured."""
        out = {}
        for name, slot in self.param_slots.items():
            value = self.plan.constants.get(slot)
            b = self.plan.constant_backend.get(slot)
            out[name] = np.asarray(b.memory.to_host(value)) if value is not None else _host(self.captured[slot])
        return out

    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        for name, slot in self.param_slots.items():
            if slot in self.plan.constants and name in params:
                self.plan.constants[slot] = self.plan.constant_backend[slot].memory.to_device(params[name])

    def run(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Apply the (all-reduced) gradients; returns the new parameters."""
        self.executor.run(*[grads[n] for n in self.names])
        return self.parameters()


def pack_shards(shards: list[list[str]], flat: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
    """(one float32 buffer of len(shards) equal parts, the part's length): part r holds shard r's arrays in
    order, zero-padded to the longest shard. The layout of a reduce-scatter (rank r receives the sum of part r)
    and of an all-gather (every rank sends its own part)."""
    sizes = [sum(flat[n].size for n in names) for names in shards]
    part = max(sizes + [1])
    buf = np.zeros(part * len(shards), np.float32)
    for r, names in enumerate(shards):
        at = r * part
        for n in names:
            buf[at:at + flat[n].size] = flat[n].reshape(-1)
            at += flat[n].size
    return buf, part


def unpack_shard(part: np.ndarray, names: list[str], shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """One part of pack_shards' buffer back into its arrays (name -> array of its shape)."""
    out, at = {}, 0
    for n in names:
        size = int(np.prod(shapes[n], dtype=np.int64))
        out[n] = part[at:at + size].reshape(shapes[n])
        at += size
    return out


def _host(value) -> np.ndarray:
    return value.detach().numpy() if hasattr(value, "detach") else np.asarray(value)
