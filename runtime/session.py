"""Session: the one call that takes a model spec and a backend spec to a runnable plan."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from . import backends, models
from .capture import capture
from .compare import REL_BASIS, compare  # noqa: F401  (callers read them from here)
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


