"""Session: the one call that takes a model spec and a backend spec to a runnable plan."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from . import backends, models
from .capture import capture
from .executor import Executor, Plan, compile_plan
from .graph import Graph
from .hdi import Backend


@dataclass
class Session:
    spec: str
    model: torch.nn.Module
    inputs: tuple
    graph: Graph
    backend: Backend
    plan: Plan
    executor: Executor
    capture_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    # A tuned configuration (profiler/tune.py) may run the batch in `chunks` pieces, one after
    # another, and the model in another dtype (`run_inputs`); eager() still runs the model as written.
    chunks: int = 1
    run_inputs: tuple | None = None

    def _pieces(self) -> list[tuple]:
        inputs = self.inputs if self.run_inputs is None else self.run_inputs
        if self.chunks == 1:
            return [inputs]
        return [tuple(x[i * (x.shape[0] // self.chunks):(i + 1) * (x.shape[0] // self.chunks)]
                      if isinstance(x, torch.Tensor) and x.dim() > 0 else x for x in inputs)
                for i in range(self.chunks)]

    def run(self) -> list:
        """One step on the backend; the outputs stay there (with chunks: the last piece's)."""
        out = []
        for piece in self._pieces():
            out = self.executor.run(*piece)
        return out

    def run_host(self) -> list[np.ndarray]:
        outs = [self.executor.run_host(*piece) for piece in self._pieces()]
        if len(outs) == 1:
            return outs[0]
        return [np.concatenate([np.asarray(o[i]) for o in outs], axis=0) for i in range(len(outs[0]))]

    def eager(self) -> list[np.ndarray]:
        """The model's own outputs in eager PyTorch, flattened like the graph's outputs."""
        return eager_outputs(self.model, self.inputs)


def eager_outputs(model: torch.nn.Module, inputs: tuple) -> list[np.ndarray]:
    """`model(*inputs)` in eager PyTorch, flattened like a graph's outputs, as numpy arrays."""
    with torch.no_grad():
        out = model(*inputs)
    return [t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
            for t in _flat_tensors(out)]


def _flat_tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        out = out.to_tuple() if hasattr(out, "to_tuple") else tuple(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat_tensors(o)]
    from .outputs import held_tensors
    return held_tensors(out)          # a KV cache: its tensors, in the order capture traced them


def open_session(model_spec: str, backend_spec: str, *, allow_fallback: bool = True, model=None, inputs=None) -> Session:
    """Capture a model and place it on a backend, ready to run.

    model_spec is `demo:NAME` or `path/to/file.py:factory` (or any label when `model` and `inputs` are given);
    backend_spec is `numpy`, `torch:DEVICE`, `sim:NAME`, a stack name or a description file. Ops the backend
    lacks go to its fallback unless allow_fallback is False. The session's `run()` / `run_host()` execute the
    plan, `eager()` runs the same inputs in PyTorch, and `executor.hooked(hook)` sees every op.
    """
    backend = backends.resolve(backend_spec)        # bad backend spec fails before the model loads
    if model is None:
        model, inputs = models.load(model_spec)
    t0 = time.perf_counter()
    graph = capture(model, inputs, name=model_spec)
    t1 = time.perf_counter()
    plan = compile_plan(graph, backend, allow_fallback=allow_fallback)
    return Session(model_spec, model, inputs, graph, backend, plan, Executor(plan), t1 - t0)


REL_FLOOR = 1e-6
REL_BASIS = f"per element, |actual - expected| / max(|expected|, {REL_FLOOR:g}): large where expected is near 0"


def compare(actual: list, expected: list) -> dict:
    """max abs / max rel error and cosine similarity over all outputs (float64).

    max_rel is per element over REL_BASIS (rel_basis in the result says so, for reports). A value
    that is NaN on one side only, or outputs with nothing finite to compare, make the errors NaN:
    "0.00e+00" for an all-NaN output would read as a perfect match. `note` says why.
    """
    with np.errstate(all="ignore"):      # NaN and inf are reported, not warned about
        return _compare(actual, expected)


def _compare(actual: list, expected: list) -> dict:
    max_abs = max_rel = 0.0
    dot = na = nb = 0.0
    compared = 0
    notes = []
    for a, e in zip(actual, expected):
        a = np.asarray(a, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        if a.shape != e.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0, "rel_basis": REL_BASIS,
                    "note": f"shape {a.shape} != {e.shape}"}
        if a.size == 0:
            continue
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        one_sided = int(np.count_nonzero(nan_a != nan_e))
        if one_sided:
            notes.append(f"{one_sided} value(s) NaN on one side only")
        same = (a == e) | (nan_a & nan_e)          # equal infinities and NaN on both sides agree
        d = np.abs(a - e)
        d = np.where(same, 0.0, d)
        if np.isnan(d).any():                      # one-sided NaN, inf against a finite value
            max_abs = max_rel = float("nan")
        elif not np.isnan(max_abs):
            max_abs = max(max_abs, float(np.max(d)))
            max_rel = max(max_rel, float(np.max(d / np.maximum(np.abs(e), REL_FLOOR))))
        compared += int(np.count_nonzero(~(nan_a & nan_e)))
        finite = np.isfinite(a) & np.isfinite(e)          # the cosine is of the values both sides have
        fa, fe = np.where(finite, a, 0.0).ravel(), np.where(finite, e, 0.0).ravel()
        dot += float(fa @ fe)
        na += float(fa @ fa)
        nb += float(fe @ fe)
    if not compared and any(np.asarray(a).size for a in actual):
        max_abs = max_rel = float("nan")
        notes.append("every output value is NaN: nothing to compare")
    cos = dot / (np.sqrt(na) * np.sqrt(nb)) if na > 0 and nb > 0 else 1.0
    if np.isnan(max_abs):
        cos = float("nan")
    out = {"max_abs": max_abs, "max_rel": max_rel, "cosine": float(cos), "rel_basis": REL_BASIS}
    if notes:
        out["note"] = "; ".join(notes)
    return out
