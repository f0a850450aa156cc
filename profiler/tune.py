"""The auto-tuner: search the knobs a backend exposes with Optuna, measure every trial, cache the best.

    result = tune("demo:gpt", "torch:cpu", budget=8)
    result["best"]["config"], result["cache_hit"]

Knobs per backend implementation:
    torch   threads (the description's [tuning] threads, else 1..cores), the dtype of matrix ops
            (float32 or bfloat16, kept only when the outputs stay close), batch chunking
    sim     the model's dtype (float32, or each dtype the description gives a higher peak)
    numpy   batch chunking

Trial 0 is always the default configuration, so the best found is never slower than the default
as measured here. A trial whose outputs drift from the default's (cosine below `min_cosine`) is
rejected, not chosen.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import time

import numpy as np
import torch

from opscope.runtime import backends, models
from opscope.runtime.capture import capture
from opscope.runtime.dtypes import to_torch
from opscope.runtime.errors import OpscopeError, UsageError
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.session import compare

from . import tuning_cache

MATRIX_OPS = ("linear", "matmul", "bmm", "addmm", "baddbmm", "conv2d", "conv1d", "scaled_dot_product_attention")
MIN_COSINE = 0.999


class Tuner:
    """Knobs, graphs (captured once per shape/dtype), and the measurement of one configuration."""

    def __init__(self, model_spec: str, backend_spec: str, *, repeats: int = 3):
        self.model_spec, self.backend_spec, self.repeats = model_spec, backend_spec, repeats
        self.backend = backends.resolve(backend_spec)
        self.desc = self.backend.description
        self.model, self.inputs = models.load(model_spec)
        self._graphs: dict = {}

    # --- knobs ---------------------------------------------------------------------------
    def knobs(self) -> dict[str, list]:
        impl = self.desc.implementation
        k: dict[str, list] = {}
        if impl == "torch":
            threads = self.desc.tuning.get("threads") or [1, 2]
            cores = os.cpu_count() or 1
            k["threads"] = sorted({int(t) for t in threads if 0 < int(t) <= max(cores, 1)} | {torch.get_num_threads()})
            if any(n.op in MATRIX_OPS for n in self.graph(1, self.dtype).nodes):
                k["matrix_dtype"] = ["float32", "bfloat16"] if self.dtype == "float32" else [self.dtype]
        if impl == "sim":
            f32 = self.desc.peak("float32")
            k["dtype"] = [self.dtype] + sorted(d for d, p in self.desc.peak_flops.items()
                                               if d in ("float16", "bfloat16") and p > f32 and d != self.dtype)
        if impl in ("torch", "numpy"):
            k["chunks"] = [c for c in (1, 2, 4) if self.batch % c == 0 and c <= self.batch]
        return {name: values for name, values in k.items() if values}

    def default(self) -> dict:
        d = {"threads": torch.get_num_threads(), "matrix_dtype": self.dtype, "dtype": self.dtype, "chunks": 1}
        return {k: d[k] for k in self.knobs()}

    @property
    def dtype(self) -> str:
        for p in self.model.parameters():
            if p.is_floating_point():
                return str(p.dtype).replace("torch.", "")
        return "float32"

    @property
    def batch(self) -> int:
        dims = {x.shape[0] for x in self.inputs if isinstance(x, torch.Tensor) and x.dim() > 0}
        return dims.pop() if len(dims) == 1 else 1

    # --- graphs --------------------------------------------------------------------------
    def graph(self, chunks: int, dtype: str):
        key = (chunks, dtype)
        if key not in self._graphs:
            model, inputs = self._model_inputs(chunks, dtype)
            self._graphs[key] = capture(model, inputs, name=self.model_spec)
        return self._graphs[key]

    def _model_inputs(self, chunks, dtype):
        model, inputs = self.model, self.inputs
        if dtype != self.dtype:
            t = to_torch(dtype)
            model = copy.deepcopy(model).to(t)
            inputs = tuple(x.to(t) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
        if chunks > 1:
            inputs = tuple(x[: x.shape[0] // chunks] if isinstance(x, torch.Tensor) and x.dim() > 0 else x
                           for x in inputs)
        return model, inputs

    # --- measuring -----------------------------------------------------------------------
    def measure(self, config: dict) -> tuple[float, list]:
        """Median seconds of `repeats` runs (after one warm-up) and the outputs of the last one."""
        chunks, dtype = config.get("chunks", 1), config.get("dtype", self.dtype)
        graph = self.graph(chunks, dtype)
        backend = backends.resolve(self.backend_spec)
        if config.get("matrix_dtype", self.dtype) == "bfloat16":
            _matrix_in(backend, torch.bfloat16)
        executor = Executor(compile_plan(graph, backend))
        # the full batch, split into `chunks` pieces that run one after another
        pieces = [tuple(x[i * (x.shape[0] // chunks):(i + 1) * (x.shape[0] // chunks)]
                        if isinstance(x, torch.Tensor) and x.dim() > 0 else x for x in self._model_inputs(1, dtype)[1])
                  for i in range(chunks)]
        old_threads = torch.get_num_threads()
        if "threads" in config:
            torch.set_num_threads(int(config["threads"]))
        try:
            simulated = getattr(backend.clock, "simulated", False)
            times, outs = [], None
            for r in range(self.repeats + 1):
                clock = _SimTime() if simulated else None
                t0 = time.perf_counter()
                if clock:
                    with executor.hooked(clock):
                        outs = [executor.run_host(*p) for p in pieces]
                else:
                    outs = [executor.run_host(*p) for p in pieces]
                elapsed = clock.seconds if clock else time.perf_counter() - t0
                if r:                                   # the first run warms caches and allocators
                    times.append(elapsed)
        finally:
            torch.set_num_threads(old_threads)
        joined = [np.concatenate([np.asarray(o[i], dtype=np.float64) for o in outs], axis=0) if chunks > 1
                  else np.asarray(outs[0][i], dtype=np.float64) for i in range(len(outs[0]))]
        return statistics.median(times), joined


class _SimTime:
    """Sums the simulated device time of a step (sim backends' clock is the roofline, not the host)."""

    def __init__(self):
        self.seconds = 0.0

    def after_op(self, call):
        self.seconds += (call.end_ns - call.start_ns) / 1e9


def _matrix_in(backend, dtype):
    """Run the backend's matrix ops in `dtype` (inputs cast in, outputs cast back): a per-op-class
    dtype knob that needs no change to the model. Done per backend instance, in the tuner only."""
    prepare = backend.prepare

    def tuned(node, kernel):
        k = prepare(node, kernel)
        if node.op not in MATRIX_OPS:
            return k

        def run(*args, **kwargs):
            cast = [a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
            out = k(*cast, **kwargs)
            return out.to(torch.float32) if isinstance(out, torch.Tensor) and out.dtype == dtype else out
        return run

    backend.prepare = tuned


def tune(model_spec: str, backend_spec: str, *, budget: int = 8, repeats: int = 3, use_cache: bool = True,
         min_cosine: float = MIN_COSINE, progress=None) -> dict:
    """Search, measure, cache. `progress(done, total, trial)` is called after every trial."""
    if budget < 1:
        raise UsageError(f"--budget {budget}: give at least 1 trial (trial 0 is the default configuration)")
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: give at least 1 timed run per trial")
    tuner = Tuner(model_spec, backend_spec, repeats=repeats)
    key, parts = tuning_cache.cache_key(tuner.desc, tuner.graph(1, tuner.dtype), tuner.dtype)
    knobs = tuner.knobs()
    base = {"model": model_spec, "backend": tuner.backend.name, "cache_key": key, "key_parts": parts,
            "knobs": knobs}
    if use_cache:
        hit = tuning_cache.get(key)
        if hit is not None:
            return {**base, "cache_hit": True, "trials_run": 0, "trials": [], "default": hit["default"],
                    "best": hit["best"], "speedup": hit["speedup"], "cache_path": str(tuning_cache.cache_path())}

    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials: list[dict] = []
    reference: list = []
    seen: dict[tuple, float] = {}

    def objective(trial):
        config = {name: trial.suggest_categorical(name, values) for name, values in knobs.items()}
        sig = tuple(sorted(config.items()))
        if sig in seen:                         # TPE repeats itself on small spaces: tell it, measure nothing
            return seen[sig]
        row = {"number": len(trials), "config": config, "seconds": None, "status": "ok"}
        try:
            seconds, outs = tuner.measure(config)
        except OpscopeError as e:
            row.update(status="failed", error=str(e))
        else:
            if not reference:
                reference.extend(outs)          # trial 0: the default's outputs are the reference
            err = compare(outs, reference)
            row.update(seconds=seconds, error=err)
            if err["cosine"] < min_cosine or not np.isfinite(err["max_abs"]):
                row["status"] = "rejected"      # too far from the default's numbers to be a speed-up
        trials.append(row)
        if progress:
            progress(len(trials), budget, row)
        seen[sig] = row["seconds"] if row["status"] == "ok" else float("inf")
        return seen[sig]

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial(tuner.default())
    # Every distinct configuration is measured once; the budget counts measurements, and a space
    # smaller than the budget ends the search early.
    space = math.prod(len(values) for values in knobs.values())
    attempts = 0
    while len(trials) < min(budget, space) and attempts < 20 * budget:
        study.optimize(objective, n_trials=1, catch=())
        attempts += 1
    if not trials or trials[0]["status"] != "ok":
        why = "no trial ran" if not trials else \
            trials[0]["error"] if trials[0]["status"] == "failed" else "outputs not finite"
        raise UsageError(f"the default configuration of {model_spec} on {backend_spec} did not run: {why}")
    best = min((t for t in trials if t["status"] == "ok"), key=lambda t: t["seconds"])
    default_row = trials[0]
    entry = {"default": {"config": default_row["config"], "seconds": default_row["seconds"]},
             "best": {"config": best["config"], "seconds": best["seconds"], "error": best.get("error")},
             "speedup": default_row["seconds"] / best["seconds"] if best["seconds"] else 1.0,
             "trials": len(trials), "created": time.time(), "key_parts": parts}
    tuning_cache.put(key, entry)
    return {**base, "cache_hit": False, "trials_run": len(trials), "trials": trials, "default": entry["default"],
            "best": entry["best"], "speedup": entry["speedup"], "cache_path": str(tuning_cache.cache_path())}
