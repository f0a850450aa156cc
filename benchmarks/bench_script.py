"""Script-profile overhead: the native engine, the eager engine and torch.profiler on the shipped script.

    python benchmarks/bench_script.py [--steps 300] [--reps 5] [--quick]

Each measurement is a fresh process that imports torch, then times `examples/train_tiny.py --steps N`
run as __main__ (what `opscope profile -- python examples/train_tiny.py` runs) under one of:
plain (no profiler), native (opscope's C++ RecordFunction observer), eager (opscope's Python dispatch
mode), torch.profiler (CPU activities, record_shapes=True: shapes, as opscope records them). opscope's
engines hand their batches to a sink that keeps them in memory, so this is the recording cost in the
script's process, not the stream's (the collector is another process). Modes are interleaved round by
round so load drifts hit all of them; medians; overhead = median(mode) - median(plain), and the ratio
of each opscope engine's overhead to torch.profiler's (issue 13 aims below 0.5).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import NullSink

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "train_tiny.py"
MODES = ("plain", "native", "eager", "torch.profiler")




def child(mode: str, steps: int) -> None:
    import contextlib
    import io
    import runpy

    import torch  # noqa: F401 -- imported before the clock starts, as in every mode
    sys.argv = [str(TINY), "--steps", str(steps)]
    out = io.StringIO()
    events = 0
    c0 = time.process_time()       # CPU time too: on a shared machine, wall time also counts waiting
    if mode in ("native", "eager"):
        from opscope.profiler.script import ScriptProfile
        sink = NullSink()
        prof = ScriptProfile(sink, engine=mode)
        assert prof.engine_name == mode, prof.engine_note
        t0 = time.perf_counter()
        prof.start()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(TINY), run_name="__main__")
        prof.stop()
        t = time.perf_counter() - t0
        events = sink.events
    elif mode == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p, contextlib.redirect_stdout(out):
            runpy.run_path(str(TINY), run_name="__main__")
        t = time.perf_counter() - t0
        events = len(p.events())
    else:
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(TINY), run_name="__main__")
        t = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "seconds": t, "cpu": time.process_time() - c0, "events": events}))


def measure(mode: str, steps: int) -> dict:
    # one intra-op thread: the ops are tiny, and on a shared machine OpenMP's spinning threads make every
    # mode's time noise (a step took 5 to 50 ms here with the default thread count)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    r = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(steps)], capture_output=True,
                       text=True, timeout=900, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="60 steps, 3 rounds")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child, a.steps)
    if a.quick:
        a.steps, a.reps = 60, 3
    from opscope.profiler.native.build import load
    mod, note = load(quiet=False)             # build outside the timed runs
    modes = MODES if mod is not None else tuple(m for m in MODES if m != "native")
    if mod is None:
        print(f"native engine unavailable: {note}")
    times: dict = {m: [] for m in modes}
    cpus: dict = {m: [] for m in modes}
    events: dict = {}
    for r in range(a.reps):
        for m in modes:
            res = measure(m, a.steps)
            times[m].append(res["seconds"])
            cpus[m].append(res["cpu"])
            events[m] = res["events"]
        print(f"round {r + 1}/{a.reps}: " + ", ".join(f"{m} {times[m][-1] * 1e3:.0f} ms" for m in modes), flush=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    base = med["plain"]
    print(f"\nexamples/train_tiny.py --steps {a.steps}, median of {a.reps} interleaved rounds (each a fresh process)")
    print(f"{'mode':<16}{'median ms':>12}{'overhead ms':>14}{'overhead':>10}{'events':>10}")
    for m in modes:
        print(f"{m:<16}{med[m] * 1e3:>12.1f}{(med[m] - base) * 1e3:>14.1f}{(med[m] / base - 1) * 100:>9.1f}%"
              f"{events.get(m, 0):>10}")
    cpu = {m: statistics.median(v) for m, v in cpus.items()}
    for label, t in (("wall", med), ("CPU", cpu)):
        tp = t["torch.profiler"] - t["plain"]
        for m in ("native", "eager"):
            if m in t:
                print(f"{label:>4}: {m} engine overhead / torch.profiler overhead: {(t[m] - t['plain']) / tp:.2f}x"
                      + ("   (aim < 0.5x)" if m == "native" else ""))


if __name__ == "__main__":
    main()
