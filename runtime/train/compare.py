"""The same N training steps on a backend and in eager PyTorch, from the same weights and data."""
from __future__ import annotations

import contextlib
import copy
import time

import numpy as np
import torch

from .. import backends, models
from ..step_clock import StepClock, clock_name
from .dropout import seeded_dropout
from .joint import loss_of
from .step import OptimizerSpec, Trainer


def eager_steps(model: torch.nn.Module, inputs: tuple, opt: OptimizerSpec, steps: int, on_step=None,
                spec: str = "") -> dict:
    """Train a copy of `model` for `steps` steps in eager PyTorch: losses, parameters, seconds.
    on_step(n): called after the n-th step. spec: the model's name in messages (no scalar loss)."""
    model = copy.deepcopy(model).train()
    optimizer = opt.torch_optimizer(model.parameters())
    losses, times = [], []
    # dropout by opscope's seeded-mask rule (train/dropout.py), so a model with dropout on compares by value; the
    # first step shows whether any dropout draws, and only then do the later steps pay for the mode
    rule = seeded_dropout()
    for i in range(steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with rule if i == 0 or rule.drew else contextlib.nullcontext():
            loss = loss_of(model(*inputs), spec or type(model).__name__)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(i + 1)
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    buffers = {n: b.detach().numpy().copy() for n, b in model.named_buffers()}
    return {"losses": losses, "parameters": params, "buffers": buffers, "step_seconds": times,
            "seeded_dropout": rule.drew}


def compare_with_eager(spec: str, backend_spec: str, *, steps: int = 10, optimizer: OptimizerSpec | None = None,
                       allow_fallback: bool = True, model=None, inputs=None, progress=None) -> dict:
    """Run `steps` steps of `spec` on the backend and in eager PyTorch; a JSON-ready report.
    progress(where, done): after each step ("eager PyTorch", then the backend's name), and ("capturing", 0)."""
    opt = optimizer or OptimizerSpec()
    tell = progress or (lambda where, done: None)
    backend = backends.resolve(backend_spec)          # a bad backend fails before the model loads
    if model is None:
        model, inputs = models.load_train(spec)
    reference = eager_steps(model, inputs, opt, steps, on_step=lambda n: tell("eager PyTorch", n), spec=spec)
    tell("capturing", 0)
    trainer = Trainer.create(model, inputs, backend, opt, name=spec, allow_fallback=allow_fallback)
    trainer.drop_host_copies()      # peak memory near one model's: the backend's copy is the only one kept
    losses, times, chip = [], [], []
    clock = StepClock()             # the step on the backend's own clock (a sim chip's: exact, deterministic)
    with trainer.executor.hooked(clock):
        for i in range(steps):
            clock.ns = 0
            t0 = time.perf_counter()
            losses.append(trainer.step())
            times.append(time.perf_counter() - t0)
            chip.append(clock.ns)
            tell(backend.name, i + 1)
    per_param = _errors(trainer.parameters(), reference["parameters"])
    # buffers too: in training mode batch-norm statistics never reach the loss, so only this shows them
    per_buffer = _errors(trainer.buffers(), reference["buffers"])
    loss_err = _err(np.array(losses), np.array(reference["losses"]))
    return {"model": spec, "backend": backend.name, "steps": steps,
            "optimizer": {"name": opt.name, "lr": opt.lr, "momentum": opt.momentum if opt.name == "sgd" else None,
                          "weight_decay": opt.weight_decay},
            "losses": losses, "eager_losses": reference["losses"],
            # "seeded": the model's dropout drew masks, and eager drew opscope's (DROPOUT_SEED), so it compares by value
            "dropout": "seeded" if reference["seeded_dropout"] else None,
            "loss_error": loss_err, "parameter_error": _worst(per_param), "parameters": per_param,
            "buffer_error": _worst(per_buffer), "buffers": per_buffer,
            "step_seconds": _median(times), "eager_step_seconds": _median(reference["step_seconds"]),
            # host wall above; the backend's clock here: on a sim chip the step time run/profile/optimize report
            "clock": clock_name(backend), "step_ns": sorted(chip)[len(chip) // 2] if chip else 0,
            "capture_seconds": trainer.capture_seconds,
            "nodes": len(trainer.train.graph.nodes), "phases": trainer.phase_counts(),
            "placement": trainer.plan.placement.report(), "memory": trainer.memory()}


def _errors(got: dict, want: dict) -> dict:
    missing = {"max_abs": float("inf"), "max_rel": float("inf")}
    return {name: _err(got[name], w) if name in got else missing for name, w in want.items()}


def _worst(errors: dict) -> dict:
    return {"max_abs": max([e["max_abs"] for e in errors.values()] or [0.0]),
            "max_rel": max([e["max_rel"] for e in errors.values()] or [0.0])}


def _err(got, want) -> dict:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return {"max_abs": float("inf"), "max_rel": float("inf")}
    if got.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0}
    # float64, a slice at a time: whole-tensor temporaries of a 30M GPT-2's embedding (six of 82 MB) were the
    # peak of `opscope train`'s memory, above either side's training
    got, want = got.reshape(-1), want.reshape(-1)
    worst_abs, worst_rel = [], []
    for i in range(0, got.size, _SLICE):
        w = want[i:i + _SLICE].astype(np.float64)
        d = np.abs(got[i:i + _SLICE].astype(np.float64) - w)
        worst_abs.append(d.max())
        worst_rel.append((d / np.maximum(np.abs(w), 1e-6)).max())
    return {"max_abs": float(np.max(worst_abs)), "max_rel": float(np.max(worst_rel))}   # a NaN stays NaN


_SLICE = 1 << 20


def _median(xs):
    return float(np.median(xs)) if xs else 0.0
