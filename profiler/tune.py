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
rejected, not chosen. After the search the default and the fastest contenders are measured again,
round after round, until two rounds rank them the same (`settle`): one noisy sample on a busy
machine must not crown a winner. A search that finds less than the cache already holds (--no-cache
on a noisier day) keeps the cached winner.

`run` and `profile` use the cached winner:

    session, tuned = open_tuned_session("demo:gpt", "torch:cpu")   # tuned: None, or what was applied
"""
from __future__ import annotations

import copy
import os
import statistics
import time

import numpy as np
import torch

from opscope.runtime import backends, models, registry
from opscope.runtime.capture import capture
from opscope.runtime.step_clock import StepClock
from opscope.runtime.dtypes import to_torch
from opscope.runtime.errors import OpscopeError, UsageError
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.session import compare

from opscope.runtime.passes import described
from opscope.runtime.passes.catalog import NAMES as PASS_NAMES

from . import tuning_cache
from .tune_search import check as check_search, make as make_search

SETTLE_CONTENDERS = 3      # the default plus the two fastest other configurations
SETTLE_ROUNDS = 4          # at most this many extra rounds of measurements
MATRIX_OPS = ("linear", "matmul", "bmm", "addmm", "baddbmm", "conv2d", "conv1d", "scaled_dot_product_attention")
MIN_COSINE = 0.999
# a winner that moves the outputs more than this (max abs error vs the default's) changes the
# model's numbers, not only its speed: adopted only when the user says so (--accept-precision-loss)
PRECISION_TOLERANCE = 1e-4


class Tuner:
    """Knobs, graphs (captured once per shape/dtype), and the measurement of one configuration."""

    def __init__(self, model_spec: str, backend_spec: str, *, repeats: int = 3, passes: bool = False,
                 clock=time.perf_counter):
        self.model_spec, self.backend_spec, self.repeats = model_spec, backend_spec, repeats
        # wall-clock by default (a thread count's gain is wall-clock); a one-thread benchmark passes
        # time.thread_time, which a loaded machine's other processes do not inflate
        self.clock = clock
        self.search_passes = passes
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
        if (own := registry.get(impl)) is not None and own.host_kernels:
            k["chunks"] = [c for c in (1, 2, 4) if self.batch % c == 0 and c <= self.batch]
        if self.search_passes:             # opscope's own graph passes, each on or off (--passes)
            k.update({f"pass_{name}": [False, True] for name in PASS_NAMES})
        return {name: values for name, values in k.items() if values}

    def default(self) -> dict:
        d = {"threads": torch.get_num_threads(), "matrix_dtype": self.dtype, "dtype": self.dtype, "chunks": 1}
        on = set(described(self.desc))
        d.update({f"pass_{name}": name in on for name in PASS_NAMES})
        return {k: d[k] for k in self.knobs()}

    @property
    def dtype(self) -> str:
        return model_dtype(self.model)

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
        return shaped(self.model, self.inputs, chunks, dtype)

    # --- measuring -----------------------------------------------------------------------
    def measure(self, config: dict) -> tuple[float, list]:
        """Median seconds of `repeats` runs (after one warm-up) and the outputs of the last one."""
        chunks, dtype = config.get("chunks", 1), config.get("dtype", self.dtype)
        graph = self.graph(chunks, dtype)
        backend = backends.resolve(self.backend_spec)
        if config.get("matrix_dtype", self.dtype) == "bfloat16":
            _matrix_in(backend, torch.bfloat16)
        executor = Executor(compile_plan(graph, backend, passes=passes_of(config)))
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
                clock = StepClock() if simulated else None
                t0 = self.clock()
                if clock:
                    with executor.hooked(clock):
                        outs = [executor.run_host(*p) for p in pieces]
                else:
                    outs = [executor.run_host(*p) for p in pieces]
                elapsed = clock.seconds if clock else self.clock() - t0
                if r:                                   # the first run warms caches and allocators
                    times.append(elapsed)
        finally:
            torch.set_num_threads(old_threads)
        joined = [np.concatenate([np.asarray(o[i], dtype=np.float64) for o in outs], axis=0) if chunks > 1
                  else np.asarray(outs[0][i], dtype=np.float64) for i in range(len(outs[0]))]
        return statistics.median(times), joined


def shaped(model, inputs, chunks: int, dtype: str):
    """The model and inputs in `dtype` (a copy when it changes), the inputs cut to one chunk's rows."""
    if dtype != model_dtype(model):
        t = to_torch(dtype)
        model = copy.deepcopy(model).to(t)
        inputs = tuple(x.to(t) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    if chunks > 1:
        inputs = tuple(x[: x.shape[0] // chunks] if isinstance(x, torch.Tensor) and x.dim() > 0 else x
                       for x in inputs)
    return model, inputs


def passes_of(config: dict) -> list[str] | None:
    """The passes a configuration switches on (pass_NAME knobs), or None: the description's own."""
    if not any(k.startswith("pass_") for k in config):
        return None
    return [name for name in PASS_NAMES if config.get(f"pass_{name}")]


def model_dtype(model) -> str:
    """The dtype of the model's first floating-point parameter: part of the tuning cache's key."""
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "float32"


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


def _lossy(row: dict | None) -> bool:
    e = (row or {}).get("error") or {}
    return bool(e) and not e.get("max_abs", 0.0) <= PRECISION_TOLERANCE


def tune(model_spec: str, backend_spec: str, *, budget: int = 8, repeats: int = 3, use_cache: bool = True,
         min_cosine: float = MIN_COSINE, progress=None, accept_precision_loss: bool = False,
         search: str = "bandit", passes: bool = False, seed: int = 0) -> dict:
    """Search, measure, cache. `progress(done, total, trial)` is called after every trial.

    The fastest configuration is adopted only if its outputs stay within PRECISION_TOLERANCE of the
    default's, or with `accept_precision_loss`; otherwise the fastest that does stay is, and the
    lossy one is reported (and kept in the cache entry, so accepting it later runs no trials)."""
    if budget < 1:
        raise UsageError(f"--budget {budget}: give at least 1 trial (trial 0 is the default configuration)")
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: give at least 1 timed run per trial")
    check_search(search)                        # an unknown --search fails before the model loads
    tuner = Tuner(model_spec, backend_spec, repeats=repeats, passes=passes)
    key, parts = tuning_cache.cache_key(tuner.desc, tuner.graph(1, tuner.dtype), tuner.dtype)
    knobs = tuner.knobs()
    base = {"model": model_spec, "backend": tuner.backend.name, "cache_key": key, "key_parts": parts,
            "knobs": knobs, "search": search}
    if use_cache:
        hit = tuning_cache.get(key)
        if hit is not None and accept_precision_loss and hit.get("lossy"):
            hit = _adopt_lossy(key, hit)
        if hit is not None:
            return {**base, "cache_hit": True, "trials_run": 0, "trials": [], "default": hit["default"],
                    "best": hit["best"], "speedup": hit["speedup"], "lossy": hit.get("lossy"),
                    "note": _lossy_note(hit), "cache_path": str(tuning_cache.cache_path())}

    trials: list[dict] = []
    reference: list = []
    # Trial 0 is the default; every distinct configuration is measured once; the budget counts
    # measurements, and a space smaller than the budget ends the search early.
    searcher = make_search(search, knobs, seed=seed, first=tuner.default())
    while len(trials) < budget:
        config = searcher.ask()
        if config is None:
            break
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
        searcher.tell(config, row["seconds"] if row["status"] == "ok" else None)
        if progress:
            progress(len(trials), budget, row)
    if not trials or trials[0]["status"] != "ok":
        why = "no trial ran" if not trials else \
            trials[0]["error"] if trials[0]["status"] == "failed" else "outputs not finite"
        raise UsageError(f"the default configuration of {model_spec} on {backend_spec} did not run: {why}")
    rounds = settle(tuner, trials)
    ok = [t for t in trials if t["status"] == "ok"]
    fastest = min(ok, key=lambda t: t["seconds"])
    best = fastest if accept_precision_loss else min((t for t in ok if not _lossy(t)), key=lambda t: t["seconds"])
    default_row = trials[0]
    entry = {"default": {"config": default_row["config"], "seconds": default_row["seconds"]},
             "best": {"config": best["config"], "seconds": best["seconds"], "error": best.get("error"),
                      "precision_loss_accepted": _lossy(best)},
             "speedup": default_row["seconds"] / best["seconds"] if best["seconds"] else 1.0,
             "trials": len(trials), "settle_rounds": rounds, "created": time.time(), "key_parts": parts}
    if fastest is not best:         # faster, but it changes the numbers: shown, not adopted
        entry["lossy"] = {"config": fastest["config"], "seconds": fastest["seconds"], "error": fastest.get("error"),
                          "speedup": default_row["seconds"] / fastest["seconds"] if fastest["seconds"] else 1.0}
    kept = tuning_cache.get(key)
    # speed-ups, not seconds, are compared: each is measured against its own default, on its own day
    if kept is not None and kept["speedup"] > entry["speedup"] and kept["best"]["config"] != entry["best"]["config"]:
        note = (f"the cache keeps its winner ({_fmt_cfg(kept['best']['config'])}, {kept['speedup']:.2f}x): this "
                f"search's best ({_fmt_cfg(entry['best']['config'])}, {entry['speedup']:.2f}x) is not better")
        return {**base, "cache_hit": False, "trials_run": len(trials), "trials": trials, "default": entry["default"],
                "best": entry["best"], "speedup": entry["speedup"], "cached": {k: kept[k] for k in
                                                                              ("default", "best", "speedup")},
                "kept_cached": True, "note": note, "settle_rounds": rounds,
                "cache_path": str(tuning_cache.cache_path())}
    tuning_cache.put(key, entry)
    return {**base, "cache_hit": False, "trials_run": len(trials), "trials": trials, "default": entry["default"],
            "best": entry["best"], "speedup": entry["speedup"], "kept_cached": False, "settle_rounds": rounds,
            "lossy": entry.get("lossy"), "note": _lossy_note(entry), "cache_path": str(tuning_cache.cache_path())}


def _adopt_lossy(key: str, entry: dict) -> dict:
    """--accept-precision-loss on a cached search: its faster, lossy configuration becomes the winner."""
    lossy = entry.pop("lossy")
    entry = {**entry, "best": {"config": lossy["config"], "seconds": lossy["seconds"], "error": lossy["error"],
                               "precision_loss_accepted": True}, "speedup": lossy["speedup"]}
    tuning_cache.put(key, entry)
    return entry


def _lossy_note(entry: dict) -> str:
    lossy = entry.get("lossy")
    if not lossy:
        return ""
    e = lossy.get("error") or {}
    return (f"not adopted: {_fmt_cfg(lossy['config'])} is faster ({lossy['speedup']:.2f}x) but changes the outputs "
            f"(max abs err {e.get('max_abs', float('nan')):.2e} > {PRECISION_TOLERANCE:g} vs the default's); "
            "--accept-precision-loss adopts it")


def settle(tuner: Tuner, trials: list[dict], *, contenders: int = SETTLE_CONTENDERS,
           max_rounds: int = SETTLE_ROUNDS) -> int:
    """Measure the default and the fastest ok trials again until two rounds in a row rank them the same;
    each row's seconds becomes the median of all its measurements. Returns the extra rounds run."""
    ok = [t for t in trials if t["status"] == "ok"]
    if len(ok) < 2:
        return 0
    pool = [trials[0]] + sorted((t for t in ok if t is not trials[0]), key=lambda t: t["seconds"])[:contenders - 1]
    samples = {id(t): [t["seconds"]] for t in pool}

    def ranking():
        return [t["number"] for t in sorted(pool, key=lambda t: statistics.median(samples[id(t)]))]

    previous, rounds = ranking(), 0
    while rounds < max_rounds:
        rounds += 1
        for t in pool:
            samples[id(t)].append(tuner.measure(t["config"])[0])
        now = ranking()
        if now == previous:
            break
        previous = now
    for t in pool:
        t["seconds"] = statistics.median(samples[id(t)])
        t["measurements"] = len(samples[id(t)])
    return rounds


def _fmt_cfg(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) or "default"


def cached_best(session) -> dict | None:
    """The tuning cache's winner for this session's model, backend description, versions and dtype, or None
    (no entry, or the default won)."""
    key, _ = tuning_cache.cache_key(session.backend.description, session.graph, model_dtype(session.model))
    hit = tuning_cache.get(key)
    if hit is None or hit["best"]["config"] == hit["default"]["config"] or hit["speedup"] <= 1.0:
        return None
    if _lossy(hit["best"]) and not hit["best"].get("precision_loss_accepted"):
        return None             # an entry from before the precision check: never switch numbers unasked
    return {"cache_key": key, "config": hit["best"]["config"], "speedup": hit["speedup"],
            "default": hit["default"]["config"], "error": hit["best"].get("error")}


def applied_line(best: dict) -> str:
    """What `run` and `profile` print: each tuned setting applied, from what, and what it costs."""
    default = best.get("default") or {}
    changes = ", ".join(f"{k} {default[k]} -> {v}" if k in default and default[k] != v else f"{k} {v}"
                        for k, v in best["config"].items() if default.get(k) != v) or _fmt_cfg(best["config"])
    e = best.get("error") or {}
    cost = (f"; outputs max abs err {e['max_abs']:.2e} vs the default's (precision loss accepted)"
            if _lossy(best) else "")
    return (f"tuned settings applied: {changes} ({best['speedup']:.2f}x in `opscope tune`{cost}); "
            "--no-tune runs the default")


def open_tuned_session(model_spec: str, backend_spec: str, *, allow_fallback: bool = True, use_tuned: bool = True):
    """open_session, then the tuner's cached best configuration applied when there is one.

    Returns (session, tuned): tuned is None or {"config", "speedup", "cache_key", "says"} where `says` is
    the line a command prints. The session's eager() still runs the model as written."""
    from opscope.runtime import open_session
    from opscope.runtime.session import Session

    s = open_session(model_spec, backend_spec, allow_fallback=allow_fallback)
    best = cached_best(s) if use_tuned else None
    if best is None:
        return s, None
    config = best["config"]
    if "threads" in config:
        torch.set_num_threads(int(config["threads"]))      # the command's process only
    dtype = config.get("dtype", model_dtype(s.model))
    chunks = int(config.get("chunks", 1))
    if (dtype != model_dtype(s.model) or chunks > 1 or config.get("matrix_dtype") == "bfloat16"
            or passes_of(config) is not None):
        model, piece = shaped(s.model, s.inputs, chunks, dtype)
        graph = capture(model, piece, name=model_spec)
        backend = backends.resolve(backend_spec)
        if config.get("matrix_dtype") == "bfloat16":
            _matrix_in(backend, torch.bfloat16)
        plan = compile_plan(graph, backend, allow_fallback=allow_fallback, passes=passes_of(config))
        s = Session(model_spec, s.model, s.inputs, graph, backend, plan, Executor(plan), s.capture_seconds,
                    chunks=chunks, run_inputs=shaped(s.model, s.inputs, 1, dtype)[1])
    says = applied_line(best)
    return s, {**best, "says": says}
