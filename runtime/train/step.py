"""A whole training step as one plan: the joint graph plus one optimizer node per parameter,
run by the ordinary Executor with parameters, optimizer state and batch-norm statistics carried
on the backend from one step to the next.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import ops as _ops  # noqa: F401
from ..errors import UsageError
from ..executor import Executor, Plan, compile_plan
from ..graph import Graph, Node, Ref, TensorMeta
from ..hdi import Backend
from ..ops import optim as optim_ops
from .joint import JointGraph, capture_joint, phase_of

OPTIMIZERS = ("sgd", "adamw")
DEFAULT_LR = {"sgd": 1e-2, "adamw": 1e-3}


@dataclass
class OptimizerSpec:
    name: str = "sgd"
    lr: float = 1e-2
    momentum: float = 0.9                 # sgd
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)           # adamw
    eps: float = 1e-8

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {self.name!r}: use {' or '.join(OPTIMIZERS)}")
        if not self.lr > 0:
            raise UsageError(f"--lr must be > 0 (got {self.lr})")

    def torch_optimizer(self, params):
        """The eager PyTorch optimizer with the same hyperparameters (single-tensor, as the ops)."""
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                                   foreach=False)
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                 foreach=False)


@dataclass
class TrainGraph:
    graph: Graph
    joint: JointGraph
    optimizer: OptimizerSpec
    new_params: dict[str, int]             # parameter name -> slot of its updated value
    state_slots: dict[str, list[int]]      # parameter name -> its optimizer-state constant slots
    carry: dict[int, int] = field(default_factory=dict)


def build_train_graph(joint: JointGraph, opt: OptimizerSpec) -> TrainGraph:
    """Append the optimizer update of every parameter to the joint graph (phase 'optimizer')."""
    g = joint.graph
    counter = [g.num_slots]

    def new_slot(meta, constant=None):
        s = counter[0]
        counter[0] += 1
        g.slot_meta[s] = meta
        if constant is not None:
            g.constant_slots[s] = constant
        return s

    def add_node(name, op, target, args, kwargs, outs, param):
        ins = [a.slot for a in args if isinstance(a, Ref)]
        node = Node(index=len(g.nodes), name=name, op=op, target=target, args=tuple(args), kwargs=kwargs,
                    inputs=ins, outputs=outs, input_meta=[g.slot_meta[s] for s in ins],
                    output_meta=[g.slot_meta[s] for s in outs], attrs={**kwargs, "phase": "optimizer", "param": param},
                    module_path=param.rpartition(".")[0], module_type="", multi_output=True)
        g.nodes.append(node)
        return node

    carry: dict[int, int] = {}
    new_params: dict[str, int] = {}
    state: dict[str, list[int]] = {}
    step_in = step_out = None
    if opt.name == "adamw":
        meta = TensorMeta((), "float32")
        step_in = new_slot(meta, torch.zeros((), dtype=torch.float32))
        step_out = new_slot(meta)
        g.nodes.append(Node(index=len(g.nodes), name="optimizer_step_count", op="add",
                            target=torch.ops.aten.add.Tensor, args=(Ref(step_in), 1.0), kwargs={}, inputs=[step_in],
                            outputs=[step_out], input_meta=[meta], output_meta=[meta],
                            attrs={"other": 1.0, "phase": "optimizer"}))
        carry[step_in] = step_out
    for name, p in joint.param_slots.items():
        gs = joint.grad_slots.get(name)
        if gs is None:
            continue                         # a parameter the loss does not reach keeps its value
        meta = g.slot_meta[p]
        host = g.constant_slots[p]
        safe = name.replace(".", "_")
        if opt.name == "sgd":
            kw = {"lr": opt.lr, "momentum": opt.momentum, "weight_decay": opt.weight_decay}
            bufs = [new_slot(meta, _zero_state(host))] if opt.momentum else []
            args = [Ref(p), Ref(gs), Ref(bufs[0]) if bufs else None]
            outs = [new_slot(meta) for _ in range(1 + len(bufs))]
            add_node(f"sgd_{safe}", "sgd", torch.ops.opscope.sgd.default, args, kw, outs, name)
        else:
            kw = {"lr": opt.lr, "beta1": opt.betas[0], "beta2": opt.betas[1], "eps": opt.eps,
                  "weight_decay": opt.weight_decay}
            bufs = [new_slot(meta, _zero_state(host)), new_slot(meta, _zero_state(host))]
            args = [Ref(p), Ref(gs), Ref(bufs[0]), Ref(bufs[1]), Ref(step_out)]
            outs = [new_slot(meta) for _ in range(3)]
            add_node(f"adamw_{safe}", "adamw", torch.ops.opscope.adamw.default, args, kw, outs, name)
        new_params[name] = outs[0]
        state[name] = bufs
        carry[p] = outs[0]
        for b, o in zip(bufs, outs[1:]):
            carry[b] = o
    for name, s in joint.buffer_updates.items():
        carry[joint.buffer_slots[name]] = s
    g.num_slots = counter[0]
    # The step returns the loss; every carried value is an output too, so nothing frees it mid-run.
    g.output_refs = [Ref(joint.loss_slot)] + [Ref(o) for o in carry.values()]
    return TrainGraph(g, joint, opt, new_params, state, carry)


def _zero_state(host: torch.Tensor) -> torch.Tensor:
    """A zero optimizer state as the graph's host constant: one element broadcast to the parameter's shape. Each
    backend's to_device makes its own dense copy, so the host side holds no second parameter-sized zeros (AdamW's
    two were 0.25 GB of a 30M-parameter GPT-2's `opscope train`)."""
    return torch.zeros((), dtype=host.dtype).expand(host.shape)


class Trainer:
    """Runs training steps of one model on one backend; parameters stay on the backend.

        t = Trainer.create(model, inputs, backend, OptimizerSpec("adamw", lr=1e-3))
        losses = [t.step() for _ in range(10)]
        t.parameters()          # name -> numpy array, copied back from the backend on request
    """

    def __init__(self, train: TrainGraph, backend: Backend, inputs: tuple, *, allow_fallback: bool = True):
        self.train = train
        self.backend = backend
        self.inputs = tuple(inputs)
        self.plan: Plan = compile_plan(train.graph, backend, allow_fallback=allow_fallback, carry=train.carry)
        self.executor = Executor(self.plan)
        self.capture_seconds = 0.0
        self._in_place = _in_place_updates(self.plan)
        self._updating_in_place = False

    @classmethod
    def create(cls, model, inputs, backend: Backend, opt: OptimizerSpec, name: str = "", **kw) -> "Trainer":
        t0 = time.perf_counter()
        joint = capture_joint(model, inputs, name)
        t = cls(build_train_graph(joint, opt), backend, inputs, **kw)
        t.capture_seconds = time.perf_counter() - t0
        return t

    def step(self) -> float:
        """One training step; returns the loss (the only value copied to the host)."""
        self._update_in_place(not any(getattr(h, "reads_inputs_after_op", True) for h in self.executor.hooks))
        loss = self.executor.run(*self.inputs)[0]
        return float(np.asarray(self.executor.holder(self.plan.output_refs[0].slot).memory.to_host(loss)))

    def _update_in_place(self, on: bool) -> None:
        """Unwatched, the optimizer ops write into the old parameter and state, as torch.optim does (no
        fresh parameter-sized tensors every step). Under a hook they stay functional, so a hook that reads an
        op's inputs after it ran (the debugger's lockstep and history) sees them as they were -- unless every
        hook says it does not: `reads_inputs_after_op = False` (a profiler that times ops and summarises
        outputs), so it times the same kernels an unwatched step runs."""
        if on != self._updating_in_place:
            for st, functional, in_place in self._in_place:
                st.kernel = in_place if on else functional
            self._updating_in_place = on

    def drop_host_copies(self) -> None:
        """Forget the graph's host copies of what the plan now holds on the backend (initial parameters, optimizer
        state, buffers), so a run keeps one copy, not two; this trainer reads them from the backend. NOTE: the
        graph can then not be compiled again (compare_with_eager calls it; the debugger and plan files keep them)."""
        consts = self.train.graph.constant_slots
        for s in self.plan.carry:
            if s in consts and s in self.plan.constants and self.plan.constants[s] is not consts[s]:
                consts[s] = None

    def parameters(self) -> dict[str, np.ndarray]:
        """Current parameter values, copied from the backend."""
        return self._read(self.train.joint.param_slots)

    def buffers(self) -> dict[str, np.ndarray]:
        """Current buffer values (batch-norm running statistics and step counts), copied from the backend."""
        return self._read(self.train.joint.buffer_slots)

    def _read(self, slots: dict[str, int]) -> dict[str, np.ndarray]:
        out = {}
        for name, slot in slots.items():
            value = self.plan.constants.get(slot)
            b = self.plan.constant_backend.get(slot, self.backend)
            # a copy: on torch:cpu to_host shares memory, and the next step updates parameters in place
            out[name] = np.array(b.memory.to_host(value)) if value is not None else \
                self.train.graph.constant_slots[slot].numpy().copy()
        for alias, name in self.train.joint.aliases.items():      # a tied tensor under each of its names
            if name in out:
                out[alias] = out[name]
        return out

    def memory(self) -> dict:
        """Bytes by category: parameters, gradients, optimizer state (resident), and activations
        (forward values still live when the backward starts: what the backward reads)."""
        g = self.train.graph
        nbytes = lambda slots: sum(g.slot_meta[s].nbytes for s in slots if s in g.slot_meta)  # noqa: E731
        state = [s for slots in self.train.state_slots.values() for s in slots]
        return {"parameters": nbytes(self.train.joint.param_slots.values()),
                "gradients": nbytes(self.train.joint.grad_slots.values()),
                "optimizer_state": nbytes(state),
                "activations": _activation_bytes(self.plan),
                "buffers": nbytes(self.train.joint.buffer_slots.values()),
                "peak_intermediates": self.plan.peak_bytes}

    def phase_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.train.graph.nodes:
            counts[phase_of(n)] = counts.get(phase_of(n), 0) + 1
        return counts


def _in_place_updates(plan: Plan) -> list[tuple]:
    """(step, functional kernel, in-place kernel) of the optimizer steps that may update in place: those the torch
    implementation runs (the kernel is the op itself) and that read the old parameter and state last."""
    last_read: dict[int, int] = {}
    for i, st in enumerate(plan.steps):
        for s in st.node.inputs:
            last_read[s] = i
    kept = {r.slot for r in plan.output_refs if isinstance(r, Ref)}
    out = []
    for i, st in enumerate(plan.steps):
        in_place = optim_ops.UPDATE_IN_PLACE.get(st.node.op)
        if in_place is None or st.kernel is not st.node.target:
            continue
        written = [a.slot for a in st.node.args[:1] + st.node.args[2:] if isinstance(a, Ref)]
        written = [s for s in written if s in plan.carry]               # parameter and state, not the step count
        # ... and whose values are the plan's own (a backend whose to_device does not copy would otherwise
        # write into the captured graph's initial weights)
        if all(last_read.get(s) == i and s not in kept and plan.constants.get(s) is not plan.graph.constant_slots.get(s)
               for s in written):
            out.append((st, st.kernel, in_place))
    return out


def _activation_bytes(plan: Plan) -> int:
    from .memory import activation_slots
    meta = plan.graph.slot_meta
    return sum(meta[s].nbytes for s in activation_slots(plan) if s in meta)
