"""HybridStrategy: split each batch across several backends in fixed ratios.

    strategy = HybridStrategy(gpu_ratio=0.7, npu_ratio=0.3, switch_threshold=1000,
                              gpu="torch:cuda:0", npu="sim:npu-a1")
    # or, for any backends:
    strategy = HybridStrategy(ratios={"torch:cpu": 0.7, "sim:npu-a1": 0.3}, switch_threshold=1000)
    result = run_hybrid(model, inputs, strategy)

Each backend gets its share of the rows (dim 0 of every input) and runs its own captured plan;
outputs are concatenated back in order. Below `switch_threshold` (the length of dim 1 of the
first input, e.g. the sequence) the whole batch stays on the first backend: splitting a short
sequence costs more in launches than it saves.

The step time reported is the slowest device's time, i.e. what the split costs when the devices
run concurrently. opscope executes the shares one after another in this process, so that figure
is an estimate for real devices -- and exact for sim devices, whose clocks are simulated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from . import backends
from .capture import capture
from .errors import UsageError
from .executor import Executor, compile_plan


SUM_TOLERANCE = 1e-6


def _shares(ratios: dict) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v!r}" for k, v in ratios.items())


@dataclass
class HybridStrategy:
    ratios: dict = field(default_factory=dict)      # backend spec -> share of the batch
    switch_threshold: int = 0
    gpu_ratio: float | None = None
    npu_ratio: float | None = None
    gpu: str = "torch:cuda:0"
    npu: str = "sim:npu-a1"

    def __post_init__(self):
        if self.gpu_ratio is not None:
            self.ratios[self.gpu] = self.gpu_ratio
        if self.npu_ratio is not None:
            self.ratios[self.npu] = self.npu_ratio
        if not self.ratios:
            raise UsageError("HybridStrategy needs ratios, e.g. {'torch:cpu': 0.7, 'sim:npu-a1': 0.3}")
        if not all(isinstance(r, (int, float)) and math.isfinite(r) and r >= 0 for r in self.ratios.values()):
            raise UsageError(f"hybrid shares must be numbers >= 0, got {_shares(self.ratios)}")
        total = sum(self.ratios.values())
        # NOTE: shares that do not add up to 1 are a typo more often than a wish: 0.7 + 0.5 is refused,
        # not silently read as 58%/42%. Only rounding (0.33 * 3 within 1e-6) is normalised away.
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise UsageError(f"hybrid shares {_shares(self.ratios)} sum to {total:g}: they must sum to 1")
        if self.switch_threshold < 0:
            raise UsageError(f"switch_threshold {self.switch_threshold}: give 0 or more")
        self.ratios = {k: v / total for k, v in self.ratios.items()}

    @classmethod
    def parse(cls, text: str, switch_threshold: int = 0) -> "HybridStrategy":
        """'torch:cpu=0.7,sim:npu-a1=0.3' (the CLI's --hybrid)."""
        usage = UsageError(f"--hybrid {text!r}: expected BACKEND=SHARE[,BACKEND=SHARE...], e.g. "
                           "torch:cpu=0.7,sim:npu-a1=0.3")
        ratios = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            spec, sep, share = part.rpartition("=")
            try:
                ratios[spec] = float(share)
            except ValueError:
                spec = ""
            if not sep or not spec:
                raise usage
        if not ratios:
            raise usage
        return cls(ratios=ratios, switch_threshold=switch_threshold)

    def split(self, rows: int, length: int) -> list[tuple[str, int]]:
        """(backend spec, rows) per backend; largest-remainder rounding, every row placed once."""
        specs = list(self.ratios)
        if length < self.switch_threshold or rows < 2:
            return [(specs[0], rows)]
        exact = [self.ratios[s] * rows for s in specs]
        counts = [int(e) for e in exact]
        for i in sorted(range(len(specs)), key=lambda i: exact[i] - counts[i], reverse=True)[:rows - sum(counts)]:
            counts[i] += 1
        return [(s, c) for s, c in zip(specs, counts) if c > 0]

    def split_note(self, rows: int, length: int) -> str | None:
        """What the split did when it could not honour the ratios (None when it did, within one row)."""
        parts = self.split(rows, length)
        if len(self.ratios) > 1 and len(parts) == 1:
            why = (f"the sequence ({length}) is shorter than the switch threshold ({self.switch_threshold})"
                   if length < self.switch_threshold else f"a batch of {rows} row(s) cannot be split")
            return f"{why}: all {rows} row(s) ran on {parts[0][0]}"
        got = dict(parts)
        if all(abs(got.get(s, 0) - r * rows) < 1e-9 for s, r in self.ratios.items()):
            return None
        return (f"a batch of {rows} rows splits in whole rows: "
                f"{'/'.join(str(got.get(s, 0)) for s in self.ratios)} rows "
                f"({'/'.join(f'{got.get(s, 0) / rows:.2f}' for s in self.ratios)}) for shares "
                f"{'/'.join(f'{r:.2f}' for r in self.ratios.values())}")


class _Timer:
    """Device time of one share: the sum of its ops' durations on the backend's own clock."""

    def __init__(self):
        self.ns = 0

    def after_op(self, call):
        if call.end_ns:
            self.ns += call.end_ns - call.start_ns


@dataclass
class HybridResult:
    outputs: list
    shares: list[dict]            # backend, rows, seconds, ops, fallback ops
    step_seconds: float           # the slowest share (devices run concurrently)
    note: str | None = None       # what the split did when it could not honour the ratios


def run_hybrid(model: torch.nn.Module, inputs: tuple, strategy: HybridStrategy, *, _cache=None) -> HybridResult:
    """Run one step split by `strategy`; pass the same `_cache` dict to reuse captured plans."""
    if not inputs or not all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in inputs):
        raise UsageError("a hybrid run splits dim 0 of every input: the model's example inputs must all be "
                         "tensors with at least one dimension")
    rows = int(inputs[0].shape[0])
    length = int(inputs[0].shape[1]) if inputs[0].dim() > 1 else 0
    cache = _cache if _cache is not None else {}
    outputs, shares, start = [], [], 0
    for spec, n in strategy.split(rows, length):
        chunk = tuple(x[start:start + n] for x in inputs)
        start += n
        key = (spec, tuple(tuple(x.shape) for x in chunk))
        if key not in cache:
            backend = backends.resolve(spec)
            cache[key] = Executor(compile_plan(capture(model, chunk, name="hybrid"), backend))
        ex = cache[key]
        timer = _Timer()
        with ex.hooked(timer):
            outs = ex.run_host(*chunk)
        outputs.append(outs)
        rep = ex.plan.placement.report()
        shares.append({"backend": spec, "rows": n, "seconds": timer.ns / 1e9, "ops": len(ex.plan.graph.nodes),
                       "fallback_ops": [f["op"] for f in rep["fallback_ops"]]})
    merged = [np.concatenate([o[i] for o in outputs], axis=0) if len(outputs) > 1 else outputs[0][i]
              for i in range(len(outputs[0]))]
    return HybridResult(merged, shares, max(s["seconds"] for s in shares), strategy.split_note(rows, length))
