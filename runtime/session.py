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

    def run(self) -> list:
        return self.executor.run(*self.inputs)

    def run_host(self) -> list[np.ndarray]:
        return self.executor.run_host(*self.inputs)

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
    return []


def open_session(model_spec: str, backend_spec: str, *, allow_fallback: bool = True, model=None, inputs=None) -> Session:
    backend = backends.resolve(backend_spec)        # bad backend spec fails before the model loads
    if model is None:
        model, inputs = models.load(model_spec)
    t0 = time.perf_counter()
    graph = capture(model, inputs, name=model_spec)
    t1 = time.perf_counter()
    plan = compile_plan(graph, backend, allow_fallback=allow_fallback)
    return Session(model_spec, model, inputs, graph, backend, plan, Executor(plan), t1 - t0)


def compare(actual: list, expected: list) -> dict:
    """max abs / max rel error and cosine similarity over all outputs (float64)."""
    max_abs = max_rel = 0.0
    dot = na = nb = 0.0
    for a, e in zip(actual, expected):
        a = np.asarray(a, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        if a.shape != e.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0,
                    "note": f"shape {a.shape} != {e.shape}"}
        if a.size == 0:
            continue
        both_nan = np.isnan(a) & np.isnan(e)
        d = np.where(both_nan, 0.0, np.abs(a - e))
        max_abs = max(max_abs, float(np.max(d)))
        max_rel = max(max_rel, float(np.max(d / np.maximum(np.abs(e), 1e-6))))
        fa, fe = np.nan_to_num(a).ravel(), np.nan_to_num(e).ravel()
        dot += float(fa @ fe)
        na += float(fa @ fa)
        nb += float(fe @ fe)
    cos = dot / (np.sqrt(na) * np.sqrt(nb)) if na > 0 and nb > 0 else 1.0
    return {"max_abs": max_abs, "max_rel": max_rel, "cosine": float(cos)}
