"""Passes: per pass, numpy and torch:cpu wall time and sim:npu-a1 step time (its simulated clock)
with and without it on demo:gpt; and `run --plan` start-up (load a saved plan) vs capture + passes.
Sides run interleaved in this process; medians and ratios are printed (no thresholds).

    python benchmarks/bench_passes.py [--quick] [--model demo:gpt] [--repeat 10]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from opscope.runtime import backends, models
from opscope.runtime.capture import capture
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.passes import NAMES
from opscope.runtime.passes.advice import step_seconds
from opscope.runtime.passes.plan_file import compile_to_file, open_plan_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo:gpt")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="3 rounds, for a smoke run")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    repeat = 3 if a.quick else a.repeat
    model, inputs = models.load(a.model)
    graph = capture(model, inputs, a.model)
    print(f"{a.model}: {len(graph.nodes)} ops captured; {repeat} rounds; ratios are with/without (<1: faster)")
    print(f"{'pass':8} {'numpy ms':>18} {'torch:cpu ms':>18} {'sim:npu-a1 us':>18}")
    for name in NAMES + ("all",):
        cells = []
        for spec in ("numpy", "torch:cpu", "sim:npu-a1"):
            b = backends.resolve(spec)
            exs = {p: Executor(compile_plan(graph, b, passes=p)) for p in ("none", name)}
            times = {p: [] for p in exs}
            for _ in range(repeat):
                for p, ex in exs.items():          # interleaved: drift hits both sides
                    device, wall = step_seconds(ex.plan, ex, inputs, steps=1)
                    times[p].append(device if spec.startswith("sim:") else wall)
            off, on = statistics.median(times["none"]), statistics.median(times[name])
            scale = 1e6 if spec.startswith("sim:") else 1e3
            cells.append(f"{off * scale:7.2f}->{on * scale:7.2f} {on / off:4.2f}x")
        print(f"{name:8} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.opsplan"
        info = compile_to_file(path, a.model, "sim:npu-a1")
        capture_s = info["timing"]["capture_seconds"] + info["timing"]["compile_seconds"]
        starts = []
        for _ in range(max(3, repeat // 3)):
            t0 = time.perf_counter()
            s = open_plan_session(path, a.model)
            starts.append((s.extra["plan"]["startup_seconds"], time.perf_counter() - t0))
        load = statistics.median(x[0] for x in starts)
        print(f"run --plan start-up: load {load * 1e3:.1f} ms vs capture+passes {capture_s * 1e3:.1f} ms "
              f"({capture_s / load:.1f}x faster); with the model's own construction "
              f"{statistics.median(x[1] for x in starts) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
