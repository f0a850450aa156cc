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
        total = sum(self.ratios.values())
        if not all(math.isfinite(r) and r >= 0 for r in self.ratios.values()) or total <= 0:
            raise UsageError(f"HybridStrategy ratios must be finite, >= 0 and sum to more than 0, got {self.ratios}")
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
    return HybridResult(merged, shares, max(s["seconds"] for s in shares))
