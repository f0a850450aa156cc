"""The learning tuner against TPE and random search at equal budgets (issue 37).

    python benchmarks/bench_tuner.py [--models demo:mlp@numpy,demo:cnn@numpy,demo:gpt@numpy,demo:gpt@torch:cpu]
                                     [--budgets 4,8,16,32] [--seeds 5] [--repeats 5] [--rounds 3] [--table DIR]

A tabular benchmark, as NAS-Bench does for architecture search: every configuration of `opscope tune
--passes`'s space (the backend's knobs plus each of opscope's six graph passes on or off) is measured per
model, and the searchers are replayed on that table: each asks for configurations in turn and is told the
measured time, so a budget of N is N measured configurations and every searcher meets the same numbers.
Configurations whose outputs move past the tuner's tolerance count as failed, as `tune` treats them.

The tables are made to hold the configurations' own costs, not the machine's load: a one-thread backend
is timed by the calling thread's CPU time (a thread-count knob needs the wall clock), each sample is the
median of --repeats runs, and each configuration keeps the least of --rounds samples taken in interleaved
passes over the space. Printed per table: the samples' spread and how much an additive model of the knobs
explains (R^2) -- the two numbers that say whether the table is signal or noise.

Searchers: bandit (the learning agent, no prior), bandit+prior (its prior learnt by
tune_search.learn_prior from the OTHER models' tables, never this one's), tpe, random. Printed per model:
the best step found per budget (median over seeds, as a ratio to the table's best: 1.00 is optimal) and
the budget at which each first reaches TPE's median result at the largest budget.
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

MODELS = "demo:mlp@numpy,demo:cnn@numpy,demo:gpt@numpy,demo:gpt@torch:cpu"


def measure_table(model: str, backend: str, repeats: int, rounds: int) -> dict:
    """Every configuration's step seconds: `rounds` passes over the whole space, interleaved (so a burst of
    load lands on a few configurations of one pass, not on one configuration's every sample), each sample
    the median of `repeats` timed runs, and the least sample kept -- load only ever adds time, so the least
    of several is the configuration's own cost (one demo:cnn trial measured 17 and 52 ms at load 27)."""
    import numpy as np

    from opscope.profiler.tune import PRECISION_TOLERANCE, Tuner
    from opscope.runtime.errors import OpscopeError
    from opscope.runtime.session import compare
    tuner = Tuner(model, backend, repeats=repeats, passes=True)
    knobs = tuner.knobs()
    # one thread: the calling thread's CPU time is the step's cost and not the machine's load; a thread
    # count among the knobs needs the wall clock (two threads spend more CPU time to finish sooner)
    clock = "wall" if len(knobs.get("threads", [])) > 1 else "thread CPU"
    tuner.clock = time.perf_counter if clock == "wall" else time.thread_time
    knobs.pop("matrix_dtype", None)      # bfloat16 moves outputs past the tolerance: never adopted unasked
    default = {k: v for k, v in tuner.default().items() if k in knobs}
    reference = tuner.measure(default)[1]
    configs = [dict(zip(knobs, vals)) for vals in itertools.product(*knobs.values())]
    samples: list[list[float] | None] = [[] for _ in configs]
    t0 = time.monotonic()
    for _ in range(rounds):
        for i, config in enumerate(configs):
            if samples[i] is None:       # failed or lossy once: out of the table
                continue
            try:
                seconds, outs = tuner.measure(config)
                err = compare(outs, reference)
                ok = np.isfinite(err["max_abs"]) and err["max_abs"] <= max(PRECISION_TOLERANCE, 1e-3)
            except OpscopeError:
                ok = False
            if ok:
                samples[i].append(seconds)
            else:
                samples[i] = None
    rows = [{"config": c, "seconds": min(s) if s else None, "samples": s} for c, s in zip(configs, samples)]
    return {"model": model, "backend": backend, "knobs": knobs, "default": default, "rows": rows,
            "measured_s": time.monotonic() - t0, "load": os.getloadavg()[0], "rounds": rounds, "repeats": repeats,
            "clock": clock}


def quality(table: dict) -> tuple[float, float]:
    """(the median spread of a configuration's samples, max/min - 1; how much of the log step time an
    additive model of the knobs explains, R^2): a table the searchers can learn from has a small spread
    and a high R^2; at load 27 the spread was large and R^2 0.33-0.45."""
    import numpy as np
    ok = [r for r in table["rows"] if r["seconds"] is not None]
    spread = statistics.median(max(r["samples"]) / min(r["samples"]) - 1 for r in ok) if ok[0].get("samples") \
        else float("nan")
    cols = [(k, v) for k, vals in table["knobs"].items() for v in vals]
    x = np.array([[1.0] + [float(r["config"][k] == v) for k, v in cols] for r in ok])
    y = np.log([r["seconds"] for r in ok])
    fit = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    return spread, 1 - float(np.var(y - fit) / np.var(y)) if np.var(y) > 0 else 1.0


def replay(table: dict, search: str, budget: int, seed: int, prior: dict | None = None) -> list[float]:
    """The best time found after each measurement."""
    from opscope.profiler.tune_search import make
    times = {json.dumps(r["config"], sort_keys=True): r["seconds"] for r in table["rows"]}
    s = make(search, table["knobs"], seed=seed, first=table["default"], prior=prior)
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
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per sample (their median is the sample)")
    ap.add_argument("--rounds", type=int, default=3, help="samples per configuration, interleaved (the least counts)")
    ap.add_argument("--table", default=None, help="folder for the measured tables (reused when present)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    budgets = [int(b) for b in args.budgets.split(",")]
    folder = Path(args.table) if args.table else None
    tables = []
    for item in args.models.split(","):
        model, _, backend = item.rpartition("@")
        path = folder / f"{model.replace(':', '_')}-{backend.replace(':', '_')}.json" if folder else None
        if path and path.is_file():
            table = json.loads(path.read_text())
        else:
            table = measure_table(model, backend, args.repeats, args.rounds)
            if path:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(table))
        tables.append(table)
    from opscope.profiler.tune_search import learn_prior
    searches = ("bandit", "bandit+prior", "tpe", "random")
    met = dict.fromkeys(("bandit", "bandit+prior"), 0)
    for table in tables:
        model, backend = table["model"], table["backend"]
        ok = [r["seconds"] for r in table["rows"] if r["seconds"] is not None]
        best = min(ok)
        default_s = next(r["seconds"] for r in table["rows"] if r["config"] == table["default"])
        spread, r2 = quality(table)
        print(f"\n{model} on {backend}: {len(table['rows'])} configurations ({len(ok)} within tolerance) measured "
              f"in {table['measured_s']:.0f} s at load {table['load']:.1f}; best {best * 1e3:.2f} ms, default "
              f"{default_s * 1e3:.2f} ms ({default_s / best:.2f}x the best); samples' spread {spread:.1%}, "
              f"additive R^2 {r2:.2f}")
        # the learned prior: every other model's table, never this one's (it would be told the answer)
        prior = learn_prior([[(r["config"], r["seconds"]) for r in t["rows"]] for t in tables if t is not table])
        traces = {s: [replay(table, s.split("+")[0], max(budgets), seed, prior if "+" in s else None)
                      for seed in range(args.seeds)] for s in searches}
        print(f"  {'budget':>8s}" + "".join(f"{s:>14s}" for s in searches))
        for b in budgets:
            cells = [statistics.median(t[min(b, len(t)) - 1] for t in traces[s]) / best for s in traces]
            print(f"  {b:8d}" + "".join(f"{c:14.3f}" for c in cells))
        target = statistics.median(t[-1] for t in traces["tpe"])
        reach = {}
        for s, ts in traces.items():
            med = [statistics.median(t[min(i, len(t) - 1)] for t in ts) for i in range(max(budgets))]
            reach[s] = next((i + 1 for i, v in enumerate(med) if v <= target), None)
        for s in met:
            met[s] += bool(reach[s] and reach[s] <= max(budgets) // 2)
        # the exact optimum of a table is partly the luck of its least sample (configurations a pass does not
        # change tie within the noise): the budget to come within 1% of it says what each searcher learnt
        near = {s: next((i + 1 for i in range(max(budgets))
                         if statistics.median(t[min(i, len(t) - 1)] for t in ts) <= 1.01 * best), None)
                for s, ts in traces.items()}
        print(f"  measurements to reach TPE's result at budget {max(budgets)} ({target / best:.3f}x the best): "
              + ", ".join(f"{s} {reach[s] if reach[s] else '>' + str(max(budgets))}" for s in reach)
              + f"   (aim: <= {max(budgets) // 2})")
        print("  measurements to come within 1% of the table's best: "
              + ", ".join(f"{s} {near[s] if near[s] else '>' + str(max(budgets))}" for s in near))
    print("\nreached TPE's final result in at most half its budget (aim: on at least 2 models): "
          + ", ".join(f"{s} on {n} of {len(tables)}" for s, n in met.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
