"""Debugging a training step: forward, loss, backward and the optimizer as one plan to step through.

    session = open_train_session("demo:mlp", "numpy", OptimizerSpec("sgd"))
    ctl = Controller(session, reference="numpy", break_on_nan=True)
    ctl.cont(); stop = ctl.wait()
    stop.phase, stop.backward_of     # 'backward', "backward of mul (model.py:11): ..."

A run of the controller is one training step (the trainer's plan carries parameters and optimizer
state to the next run), so `r` steps the model once more. Lockstep runs the same plan on the
reference, so gradients (backward ops' outputs) and updated parameters (optimizer ops' outputs)
are compared op by op like any activation; the reference carries its own parameters across
steps. Watches get `grad`: the gradient a backward op made, or the one an optimizer op applies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opscope.runtime.graph import Ref
from opscope.runtime.train.joint import forward_of, phase_of

from .watches import Watches


@dataclass
class TrainSession:
    """What the controller needs of a session (spec, model, inputs, backend, plan, executor)."""

    spec: str
    model: object
    inputs: tuple
    backend: object
    plan: object
    executor: object
    trainer: object
    extra: dict = field(default_factory=dict)


def open_train_session(spec: str, backend: str, optimizer) -> TrainSession:
    """Capture the training step of `spec` (its model returns the loss) and place it on `backend`."""
    from opscope.runtime import backends, models
    from opscope.runtime.train import Trainer

    b = backends.resolve(backend)          # a bad backend spec fails before the model loads
    model, inputs = models.load_train(spec)
    t = Trainer.create(model, inputs, b, optimizer, name=spec)
    joint, tg = t.train.joint, t.train
    names = {s: n for n, s in joint.param_slots.items()}
    names.update({s: n for n, s in joint.buffer_slots.items()})
    for n, slots in tg.state_slots.items():
        kinds = ("momentum",) if tg.optimizer.name == "sgd" else ("exp_avg", "exp_avg_sq")
        names.update({s: f"{n} {k}" for s, k in zip(slots, kinds)})
    for s in t.plan.graph.constant_slots:
        names.setdefault(s, "optimizer step count" if tg.optimizer.name == "adamw" else "a constant")
    extra = {"slot_names": names, "grad_of": {s: n for n, s in joint.grad_slots.items()}, "train": True}
    return TrainSession(spec, model, inputs, b, t.plan, t.executor, t, extra)


def backward_of(node, by_name: dict, producer: dict, labels) -> str:
    """For a backward op: the forward op it differentiates, where that is, and the inputs it read
    (the values whose gradient this backward makes)."""
    if phase_of(node) != "backward":
        return ""
    name = forward_of(node)
    fwd = by_name.get(name)
    if fwd is None:
        return f"backward of {name}" if name else ""
    mod = f" in {fwd.module_path}" if fwd.module_path else ""
    where = f" at {fwd.source}" if fwd.source else ""
    ins = [f"{lab} (from {producer[slot].name})" if slot in producer else lab for lab, _, slot in labels(fwd)]
    reads = f"; it read {', '.join(ins)}" if ins else ""
    return f"backward of {fwd.name} ({fwd.op}{mod}{where}){reads}"


def graph_index(plan) -> tuple[dict, dict]:
    """(node name -> node, slot -> the node that makes it)."""
    nodes = plan.graph.nodes
    return {n.name: n for n in nodes}, {s: n for n in nodes for s in n.outputs}


def grad_value(node, inputs: list, outputs: list):
    """The watch name `grad` at an op: a backward op's (first) output, an optimizer op's gradient input."""
    phase = phase_of(node)
    if phase == "backward" and outputs:
        return outputs[0][1]
    if phase == "optimizer" and len(node.args) > 1 and isinstance(node.args[1], Ref):
        for lab, value in inputs:
            if lab.startswith("in1"):
                return value
    return None


class NamedWatches(Watches):
    """Watches whose expressions also see `names` (set by the controller at each stop)."""

    def __init__(self):
        super().__init__()
        self.names: dict = {}

    def add(self, expr: str):
        w = super().add(expr)
        w.code = _WithNames(w.code, self.names)
        return w


class _WithNames:
    """An Expr that evaluates with extra names beside the op's own (which win on a clash)."""

    def __init__(self, code, names: dict):
        self.code, self.names = code, names

    def evaluate(self, ns: dict):
        return self.code.evaluate({**self.names, **ns})
