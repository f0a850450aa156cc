"""The learning tuner against TPE and random search at equal budgets (issue 37).

    python benchmarks/bench_tuner.py [--models demo:mlp@numpy,demo:cnn@numpy,demo:gpt@torch:cpu]
                                     [--budgets 4,8,16,32] [--seeds 5] [--repeats 3] [--table DIR]

A tabular benchmark, as NAS-Bench does for architecture search: every configuration of `opscope tune
--passes`'s space (the backend's knobs plus each of opscope's six graph passes on or off) is measured once
per model (median of --repeats timed runs, one warm-up), and the three searchers are replayed on that
table: each asks for configurations in turn and is told the measured time, so a budget of N is N
measured configurations and every searcher meets the same numbers. Configurations whose outputs move
past the tuner's tolerance count as failed, as `tune` treats them. Printed per model: the best step found
per budget (median over seeds, as a ratio to the table's best: 1.00 is optimal) for bandit (the learning
agent), tpe and random, and the budget at which each first reaches TPE's result at the largest budget.
Tables are kept in --table (JSON) so a replay needs no new measurement.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

MODELS = "demo:mlp@numpy,demo:cnn@numpy,demo:gpt@torch:cpu"


def measure_table(model: str, backend: str, repeats: int) -> dict:
    import numpy as np

    from opscope.profiler.tune import PRECISION_TOLERANCE, Tuner
    from opscope.runtime.errors import OpscopeError
    from opscope.runtime.session import compare
    tuner = Tuner(model, backend, repeats=repeats, passes=True)
    knobs = tuner.knobs()
    knobs.pop("matrix_dtype", None)      # bfloat16 moves outputs past the tolerance: never adopted unasked
    default = {k: v for k, v in tuner.default().items() if k in knobs}
    reference = tuner.measure(default)[1]
    rows = []
    t0 = time.monotonic()
    for vals in itertools.product(*knobs.values()):
        config = dict(zip(knobs, vals))
        try:
            seconds, outs = tuner.measure(config)
            err = compare(outs, reference)
            ok = np.isfinite(err["max_abs"]) and err["max_abs"] <= max(PRECISION_TOLERANCE, 1e-3)
        except OpscopeError:
            seconds, ok = None, False
        rows.append({"config": config, "seconds": seconds if ok else None})
    return {"model": model, "backend": backend, "knobs": knobs, "default": default, "rows": rows,
            "measured_s": time.monotonic() - t0, "load": os.getloadavg()[0]}


def replay(table: dict, search: str, budget: int, seed: int) -> list[float]:
    """The best time found after each measurement."""
    from opscope.profiler.tune_search import make
    times = {json.dumps(r["config"], sort_keys=True): r["seconds"] for r in table["rows"]}
    s = make(search, table["knobs"], seed=seed, first=table["default"])
    best, trace = float("inf"), []
    for _ in range(budget):
        c = s.ask()
        if c is None:
            break
        t = times[json.dumps(c, sort_keys=True)]
        s.tell(c, t)
        best = min(best, t) if t is not None else best
        trace.append(best)
    return trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS, help="MODEL@BACKEND, comma-separated")
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--table", default=None, help="folder for the measured tables (reused when present)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    budgets = [int(b) for b in args.budgets.split(",")]
    folder = Path(args.table) if args.table else None
    for item in args.models.split(","):
        model, _, backend = item.rpartition("@")
        path = folder / f"{model.replace(':', '_')}-{backend.replace(':', '_')}.json" if folder else None
        if path and path.is_file():
            table = json.loads(path.read_text())
        else:
            table = measure_table(model, backend, args.repeats)
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(table))
        ok = [r["seconds"] for r in table["rows"] if r["seconds"] is not None]
        best = min(ok)
        default_s = next(r["seconds"] for r in table["rows"] if r["config"] == table["default"])
        print(f"\n{model} on {backend}: {len(table['rows'])} configurations ({len(ok)} within tolerance) measured "
              f"in {table['measured_s']:.0f} s at load {table['load']:.1f}; best {best * 1e3:.2f} ms, default "
              f"{default_s * 1e3:.2f} ms ({default_s / best:.2f}x the best)")
        print(f"  {'budget':>8s}" + "".join(f"{s:>10s}" for s in ("bandit", "tpe", "random")))
        traces = {s: [replay(table, s, max(budgets), seed) for seed in range(args.seeds)]
                  for s in ("bandit", "tpe", "random")}
        for b in budgets:
            cells = [statistics.median(t[min(b, len(t)) - 1] for t in traces[s]) / best for s in traces]
            print(f"  {b:8d}" + "".join(f"{c:10.3f}" for c in cells))
        target = statistics.median(t[-1] for t in traces["tpe"])
        reach = {}
        for s, ts in traces.items():
            med = [statistics.median(t[min(i, len(t) - 1)] for t in ts) for i in range(max(budgets))]
            reach[s] = next((i + 1 for i, v in enumerate(med) if v <= target), None)
        print(f"  measurements to reach TPE's result at budget {max(budgets)} ({target / best:.3f}x the best): "
              + ", ".join(f"{s} {reach[s] if reach[s] else '>' + str(max(budgets))}" for s in reach)
              + f"   (aim: bandit <= {max(budgets) // 2})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
