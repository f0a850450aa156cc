"""One share's training step, timed as `train --hybrid`'s rank runs it (forward, backward and optimizer apart, and
the trainer's host bookkeeping): what runtime/dist/simulate.py measures in its process and together.py in one
process per rank.

    timer = ShareTimer(model, "demo:gpt", "torch:cpu", share_inputs(inputs, [0.5, 0.5])[0], "sgd")
    timer.time(repeats=5)            # {"forward_seconds", ..., "host_seconds", "clock", "runs": [...]}
    timer.time(9, sync=barrier)      # meeting the other ranks where the job's ranks meet (together.py)
"""
from __future__ import annotations

import statistics
import time
from collections import Counter

import numpy as np

from .shape import model_shape


class _PhaseClock:
    """An executor hook: ns per phase (forward / backward / optimizer) on the backend's clock."""
    reads_inputs_after_op = False

    def __init__(self):
        self.ns = Counter()

    def after_op(self, call) -> None:
        if call.end_ns:
            self.ns[call.node.attrs.get("phase", "forward")] += call.end_ns - call.start_ns


def share_inputs(inputs: tuple, ratios: list[float]) -> list[tuple]:
    """Each share's rows of the batch, split as train --hybrid splits them."""
    from .balance import split_rows
    out, start = [], 0
    for n in split_rows(ratios, int(inputs[0].shape[0])):
        out.append(tuple(x[start:start + n] for x in inputs))
        start += n
    return out


class ShareTimer:
    """One share's training step on its backend, ready to time: forward, backward and optimizer apart, and the
    trainer's host bookkeeping."""

    def __init__(self, model, model_spec: str, spec: str, local: tuple, optimizer: str):
        from .. import backends
        from ..step_clock import clock_name
        from ..train.joint import capture_joint
        from ..train.step import OptimizerSpec, build_train_graph
        from .split import GradientStep, OptimizerStep
        self.spec, self.local, self.rows = spec, local, int(local[0].shape[0])
        train = build_train_graph(capture_joint(model, local, model_spec), OptimizerSpec(optimizer))
        self.shape = model_shape(model_spec, train, local)
        backend = backends.resolve(spec)
        self.clock = clock_name(backend)
        self.ops = len(train.graph.nodes)
        # the optimizer runs where `train --hybrid` runs it: the host's numpy kernels, on the chip for a sim chip
        self.step = GradientStep(train, backend)
        self.opt = OptimizerStep(train, backend if self.clock == "simulated" else None)

    def run(self, sync=None) -> tuple:
        """One step: (ns per phase on the backend's clock, gradient wall s, optimizer wall s, host s, the
        seconds in each sync, the whole step's wall s). sync: called where the job's ranks meet (after backward, after the bookkeeping;
        together.py)."""
        phases = _PhaseClock()
        t0 = time.perf_counter()
        with self.step.executor.hooked(phases):
            _, grads = self.step.run(self.local)
        t1 = time.perf_counter()
        if sync:
            sync()
        t2 = time.perf_counter()
        with self.opt.executor.hooked(phases):
            params = self.opt.run(grads)
        t3 = time.perf_counter()
        host = _bookkeeping(self.step, grads, params)
        t4 = time.perf_counter()
        if sync:
            sync()
        t5 = time.perf_counter()
        return phases.ns, t1 - t0, t3 - t2, host, t2 - t1, t5 - t4, t5 - t0

    def time(self, repeats: int, sync=None) -> dict:
        """The share's measurement: a sim chip's clock is exact (one run after the warm-up), a wall clock's is
        the median of `repeats`; `runs` keeps each run's gradient, optimizer and host seconds."""
        clock = self.clock
        # warm-up: a sim chip's first run; a wall clock's first two (the first collectives among ranks set up
        # gloo's pairs, and the first steps of a fresh process fault its pages in: 2-10x a later step)
        for _ in range(1 if clock == "simulated" else 2):
            self.run(sync)
        runs = [self.run(sync) for _ in range(1 if clock == "simulated" else max(1, repeats))]
        fwd, bwd, optim = (statistics.median(r[0][k] for r in runs) / 1e9 for k in ("forward", "backward", "optimizer"))
        if clock == "wall":         # a wall-clock backend: the whole step's time, split as its ops split it
            grad_wall, opt_wall = statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs)
            fb = fwd + bwd
            fwd, bwd = (fwd / fb * grad_wall, bwd / fb * grad_wall) if fb > 0 else (grad_wall / 3, 2 * grad_wall / 3)
            optim = opt_wall
        # a sim chip's step in integer ns, exactly what `train` and `profile --train` print (one StepClock)
        exact = sum(runs[0][0].values()) if clock == "simulated" else None
        return {"backend": self.spec, "rows": self.rows, "forward_seconds": fwd, "backward_seconds": bwd,
                "optimizer_seconds": optim, "compute_seconds": fwd + bwd + optim,
                "compute_ns": int(exact) if exact is not None else round((fwd + bwd + optim) * 1e9),
                "host_seconds": statistics.median(r[3] for r in runs), "clock": clock, "ops": self.ops,
                "runs": [list(r[1:]) for r in runs]}


def _bookkeeping(step, grads: dict, params: dict) -> float:
    """The trainer's host work per step besides the ops (runtime/dist/trainer.py): flatten and scale the
    gradients, split the sum back, hand the new parameters to the plan, fingerprint them."""
    import hashlib
    t0 = time.perf_counter()
    flat = np.concatenate([grads[n].reshape(-1) for n in step.names]).astype(np.float32) * np.float32(0.5)
    at = 0
    for n in step.names:
        flat[at:at + grads[n].size].reshape(grads[n].shape)
        at += grads[n].size
    step.set_parameters(params)
    h = hashlib.blake2b(digest_size=8)
    for n in sorted(params):
        h.update(np.ascontiguousarray(params[n]).tobytes())
    return time.perf_counter() - t0
