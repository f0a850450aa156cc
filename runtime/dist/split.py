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
import torch

from .. import backends
from ..executor import Executor, compile_plan
from ..graph import Graph, Ref
from ..dtypes import to_numpy, to_torch
from ..hdi import Backend
from ..ops.optim import NUMPY_IN_PLACE
from ..train.joint import phase_of
from ..train.step import TrainGraph


def _subgraph(g: Graph, nodes, inputs, outputs, values: dict | None = None) -> Graph:
    """values: constants to read instead of the graph's (slot -> value): the rank's host parameters."""
    nodes = [dataclasses.replace(n, index=i) for i, n in enumerate(nodes)]
    read = {s for n in nodes for s in n.inputs}
    consts = {s: (values[s] if values and s in values else v) for s, v in g.constant_slots.items() if s in read}
    return Graph(nodes, g.num_slots, list(inputs), consts, [Ref(s) for s in outputs], g.slot_meta, g.model_name)


class GradientStep:
    """Forward, loss and backward of one rank's rows; returns the loss and the gradients."""

    def __init__(self, train: TrainGraph, backend: Backend, *, allow_fallback: bool = True,
                 params: dict[str, np.ndarray] | None = None):
        """params: the rank's host parameters (name -> array). A backend that reads host memory in place (torch:cpu)
        then reads these very arrays -- the optimizer's in-place update is the new value, no copy each way -- and the
        captured graph's copy is not read; another backend holds its own copy (set_parameters refreshes it)."""
        g, joint = train.graph, train.joint
        nodes = [n for n in g.nodes if phase_of(n) != "optimizer"]
        self.names = [n for n in joint.param_slots if n in joint.grad_slots]
        self.param_slots = joint.param_slots
        outs = [joint.loss_slot] + [joint.grad_slots[n] for n in self.names]
        buffers = {joint.buffer_slots[n]: s for n, s in joint.buffer_updates.items()}
        values = {s: params[n] for n, s in joint.param_slots.items() if n in params} if params else None
        self.graph = _subgraph(g, nodes, g.input_slots, outs + list(buffers.values()), values)
        self.backend = backend
        self.plan = compile_plan(self.graph, backend, allow_fallback=allow_fallback, carry=buffers)
        self.executor = Executor(self.plan)

    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        """New parameter values (host arrays) onto the backends that read them (nothing to do where a backend
        reads the host's arrays themselves)."""
        for name, slot in self.param_slots.items():
            b = self.plan.constant_backend.get(slot)
            if b is not None and name in params and not _same_memory(b, self.plan.constants.get(slot), params[name]):
                self.plan.constants[slot] = b.memory.to_device(params[name])

    def bind_remote(self, tensors: dict) -> None:
        """ZeRO-3: the plan reads these tensors (storage filled by a gather only while in use) for the parameters
        this rank does not keep; the captured values it read until now are let go."""
        for name, t in tensors.items():
            slot = self.param_slots[name]
            self.plan.constants[slot] = t
            self.graph.constant_slots[slot] = None

    def run(self, inputs: tuple, taken=()) -> tuple[float, dict[str, np.ndarray]]:
        """taken: gradients a hook already sent (and freed) during backward: not read back."""
        outs = self.executor.run(*inputs)
        refs = self.plan.output_refs
        host = [np.asarray(self.executor.holder(r.slot).memory.to_host(v))
                if i == 0 or self.names[i - 1] not in taken else None
                for i, (r, v) in enumerate(zip(refs[:1 + len(self.names)], outs))]
        return float(host[0]), {n: h for n, h in zip(self.names, host[1:]) if h is not None}


class OptimizerStep:
    """The optimizer nodes of a TrainGraph as their own plan (on the host's numpy kernels unless a
    backend is given: `opscope simulate` times them on the chip); keeps parameters and state."""

    def __init__(self, train: TrainGraph, backend: Backend | None = None, shard: list[str] | None = None,
                 params: dict[str, np.ndarray] | None = None):
        """shard: only these parameters' updates and optimizer state (ZeRO-1: each rank one shard).
        params: the rank's host parameters (name -> array), updated in place on a host backend (one copy per
        rank); None: the plan's own copies of the captured values."""
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
        # the whole model's state layout (a checkpoint holds every shard's): name -> its state slots, and the
        # slots every rank keeps whole (AdamW's step count)
        self.state_of = {n: list(train.state_slots.get(n, [])) for n in joint.param_slots if n in joint.grad_slots}
        owned = {b for bufs in train.state_slots.values() for b in bufs}
        self.shared_state = sorted(c for c in carry if c not in owned and c not in joint.param_slots.values())
        # compiled on one-element stand-ins: the plan's parameters and state are bound below, without the
        # parameter-sized copies placing the captured values would make
        mine = [joint.param_slots[n] for n in self.names] + self.state_slots
        stand_in = {s: torch.zeros((), dtype=to_torch(g.slot_meta[s].dtype)) for s in mine}
        self.graph = _subgraph(g, nodes, grad_slots, list(carry.values()), stand_in)
        self.plan = compile_plan(self.graph, backend or backends.resolve("numpy"), carry=carry)
        self.param_slots = {n: joint.param_slots[n] for n in self.names}
        for n in self.names:
            slot = joint.param_slots[n]
            self.plan.constants[slot] = _bind(self.plan.constant_backend[slot], params[n] if params is not None
                                              else _host(g.constant_slots[slot]), copy=params is None)
        for slot in self.state_slots:            # zeros: calloc'd pages, resident only once the update writes them
            m = g.slot_meta[slot]
            self.plan.constants[slot] = _bind(self.plan.constant_backend[slot], np.zeros(m.shape, to_numpy(m.dtype)))
        _update_in_place(self.plan)
        self.executor = _HostExecutor(self.plan)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this step keeps (momentum, Adam's moments): what ZeRO-1 divides."""
        total = 0
        for slot in self.state_slots:
            value = self.plan.constants.get(slot)
            if value is not None:
                total += int(np.asarray(self.plan.constant_backend[slot].memory.to_host(value)).nbytes)
        return total

    def parameters(self) -> dict[str, np.ndarray]:
        """This step's parameters (name -> host array): with host parameters, those arrays themselves."""
        return {n: np.asarray(self.plan.constant_backend[s].memory.to_host(self.plan.constants[s]))
                for n, s in self.param_slots.items()}

    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        """New values copied into the parameters this step updates (they stay the arrays the plans share)."""
        for name, slot in self.param_slots.items():
            if name in params:
                _assign(self.plan.constant_backend[slot], self.plan, slot, params[name])

    def set_state(self, values: dict[int, np.ndarray]) -> None:
        """Optimizer state by slot (a checkpoint's), copied into the state this step keeps."""
        for slot, value in values.items():
            _assign(self.plan.constant_backend[slot], self.plan, slot, value)

    def run(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Apply the (all-reduced) gradients; returns this step's parameters (updated in place where they could be)."""
        self.executor.run(*[grads[n] for n in self.names])
        return self.parameters()


class _HostExecutor(Executor):
    """An executor whose host-array inputs (the gradients) are read where they lie on a host backend: the numpy
    backend's to_device copies, and a copy of every gradient was a parameter-sized peak of its own."""

    def _env(self, inputs) -> list:
        memory = self.plan.backend.memory
        if not _reads_host(self.plan.backend):
            return super()._env(inputs)
        env = super()._env(tuple(np.zeros(0, np.float32) for _ in inputs))
        for s, v in zip(self.plan.graph.input_slots, inputs):
            env[s] = v if isinstance(v, np.ndarray) else memory.to_device(v)
        return env


def _update_in_place(plan) -> None:
    """The numpy sgd/adamw steps write into their parameter and state (bit-identical: NUMPY_IN_PLACE) where the
    plan's values are the host's own arrays of one dtype; the functional kernels stay where they are not."""
    for st in plan.steps:
        in_place = NUMPY_IN_PLACE.get(st.node.op)
        if in_place is None or getattr(st.backend.description, "implementation", "") != "numpy":
            continue          # a chip's own (or low-precision) kernel: its numbers are its own
        dtypes = {m.dtype for m in st.node.input_meta[:4] if m is not None and m.shape != ()}
        if not dtypes <= {"float32", "float64"}:
            continue          # bfloat16 lives in float32 arrays, rounded after each update: not in place
        values = [plan.constants.get(a.slot) for a in st.node.args if isinstance(a, Ref) and a.slot in plan.carry]
        if len(dtypes) == 1 and all(isinstance(v, np.ndarray) and v.flags.writeable and v.flags.c_contiguous
                                    for v in values if v is not None and v.shape != ()):
            st.kernel = in_place


_HOST: dict[int, bool] = {}


def _reads_host(b: Backend) -> bool:
    """Whether the backend's values are the host's numpy arrays themselves (numpy, sim): then a plan on it can
    hold the rank's host parameters without a copy."""
    if id(b) not in _HOST:
        probe = np.zeros(1, np.float32)
        _HOST[id(b)] = isinstance(b.memory.to_device(probe), np.ndarray)
    return _HOST[id(b)]


def _bind(b: Backend, host: np.ndarray, copy: bool = False):
    """A host array as the backend's value: the array itself on a host backend (unless a copy is asked)."""
    return host if _reads_host(b) and not copy else b.memory.to_device(host)


def _assign(b: Backend, plan, slot: int, value: np.ndarray) -> None:
    current = plan.constants.get(slot)
    if isinstance(current, np.ndarray) and current.shape == np.shape(value) and current.flags.writeable:
        np.copyto(current, value)          # in place: the arrays other plans share keep being the parameters
    else:
        plan.constants[slot] = b.memory.to_device(value)


def _same_memory(b: Backend, value, host: np.ndarray) -> bool:
    """Whether the backend's value is the host array's memory (torch:cpu reads a numpy array in place)."""
    if value is None:
        return False
    try:
        return np.shares_memory(np.asarray(b.memory.to_host(value)), host)
    except Exception:  # noqa: BLE001 -- a device value with no host view: not the same memory
        return False


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
