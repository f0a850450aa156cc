"""Export and import of a 1M-event trace, side by side with a plain json.dump / json.load baseline.

    python benchmarks/bench_trace.py            # 1M events, 3 rounds
    python benchmarks/bench_trace.py --quick    # 100k events, 1 round
    python benchmarks/bench_trace.py --events 500000 --phases   # a 1M-trace-event file (an op + a memory counter
                                                                # each), with the import's phases every round
    python benchmarks/bench_trace.py --kineto   # a real torch.profiler trace tiled to 1M events, imported
                                                # (add --phases for the import phase by phase)

`opscope trace import` is also timed as a user runs it: a fresh process, start-up and imports included.

Every timing is wall-clock seconds; phases also give CPU seconds (all threads), which is what the import
would take on an idle machine -- on a shared one the wall time mostly measures the neighbours. The load
average is printed with the results.

Baseline: the same events as a list of dicts (the fields our Chrome events carry) written with
`json.dump` and read with `json.load` -- what a straightforward exporter/importer would do.
Aim (issue 3): <= 5 s each for 1M events on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OPS = ["linear", "gelu", "layer_norm", "add", "matmul", "softmax", "mul", "view"]


def make_run(store, n: int) -> str:
    rng = np.random.default_rng(0)
    rid = store.create_run(model="bench:synthetic", backend="torch:cpu", device="cpu", steps=10)
    dur = rng.integers(1_000, 50_000, n)
    start = 10 ** 12 + np.concatenate(([0], np.cumsum(dur + 200)[:-1]))
    step = np.arange(n) * 10 // n
    op = np.asarray(OPS, dtype=object)[rng.integers(0, len(OPS), n)]
    cols = {"step": step, "seq": np.arange(n) % (n // 10 or 1), "op": op,
            "node": np.asarray([f"{o}_{i % 97}" for i, o in enumerate(op.tolist())], dtype=object),
            "module": np.full(n, "transformer.h.0.mlp", dtype=object), "source": np.full(n, "gpt.py:42", dtype=object),
            "backend": np.full(n, "torch:cpu", dtype=object), "device": np.full(n, "cpu", dtype=object),
            "thread": np.full(n, 1, dtype=np.int64), "depth": np.zeros(n, dtype=np.int64),
            "start_ns": start, "end_ns": start + dur,
            "input_shapes": np.full(n, "[[2,128,256],[256,256]]", dtype=object),
            "input_dtypes": np.full(n, '["float32","float32"]', dtype=object),
            "output_shapes": np.full(n, "[[2,128,256]]", dtype=object),
            "output_dtypes": np.full(n, '["float32"]', dtype=object),
            "bytes": rng.integers(1, 1 << 20, n), "flops": rng.integers(1, 1 << 30, n),
            "fallback": np.zeros(n, dtype=bool), "live_bytes": rng.integers(1, 1 << 30, n)}
    for lo in range(0, n, 200_000):
        store.add_event_columns(rid, {k: v[lo:lo + 200_000] for k, v in cols.items()})
    store.finish_run(rid)
    return rid


def baseline_events(store, rid):
    """The same events as plain dicts, as a straightforward exporter would build them."""
    f = store.events_frame(rid)
    t0 = int(f["start_ns"].min())
    keys = ["step", "seq", "node", "module", "source", "input_shapes", "input_dtypes", "output_shapes",
            "output_dtypes", "flops", "bytes", "fallback"]
    cols = {k: f[k].tolist() for k in keys}
    ts = ((f["start_ns"] - t0) / 1000).tolist()
    dur = ((f["end_ns"] - f["start_ns"]) / 1000).tolist()
    op = f["op"].tolist()
    return [{"name": op[i], "cat": "op", "ph": "X", "ts": ts[i], "dur": dur[i], "pid": 1, "tid": 1,
             "args": {k: cols[k][i] for k in keys}} for i in range(len(op))]


def import_phases(store, path) -> dict:
    """The import of `path`, phase by phase (what `import_trace` does, in its order): reading the JSON,
    parsing it into columns, nesting and numbering (columns), writing the store (events, details, finish)."""
    import gc
    from opscope.profiler.importers import kineto
    from opscope.profiler.importers.common import read_trace, save
    out = {}
    enabled = gc.isenabled()
    gc.disable()                            # as import_trace does
    try:
        out["read json"], doc = timed(lambda: read_trace(path), cpu=True)
        out["parse"], (table, run) = timed(lambda: kineto.parse(doc, str(path)), cpu=True)
        out["free json"], _ = timed(doc.clear, cpu=True)         # a million dicts to free: not nothing
        del doc
        out["columns"], _ = timed(table.columns, cpu=True)       # save() does this again: reported, not subtracted
        out["save (columns + insert)"], rid = timed(lambda: save(
            store, table, model="bench", backend=run["backend"], device=run["device"], source=str(path),
            config=run["config"], steps=max(1, run["steps"])), cpu=True)
    finally:
        if enabled:
            gc.enable()
    store.delete_run(rid)
    return out


def kineto_trace(path: Path, n: int) -> int:
    """A real torch.profiler trace (a small transformer layer, record_shapes + with_stack + profile_memory,
    ProfilerStep#N steps) tiled in time until it holds `n` events: each copy shifted past the last, its
    ids shifted too so flows and steps stay apart. -> the number of events written."""
    import torch
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(2, 16, 64)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, profile_memory=True, schedule=sched) as prof:
        for _ in range(4):
            with torch.no_grad():
                layer(x)
            prof.step()
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    body = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    times = [float(e["ts"]) for e in body if isinstance(e.get("ts"), (int, float))]
    span = max(times) - min(times) + 1000.0
    out, k = list(meta), 0
    while len(out) < n:
        for e in body:
            c = dict(e)
            if isinstance(c.get("ts"), (int, float)):
                c["ts"] = c["ts"] + k * span
            if c.get("name", "").startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{k * 10 + int(c['name'][13:])}"
            if "id" in c and isinstance(c["id"], int):
                c["id"] += k * 1_000_000
            out.append(c)
        k += 1
    doc["traceEvents"] = out[:n]
    path.write_bytes(orjson_dumps(doc))
    return len(doc["traceEvents"])


def orjson_dumps(doc) -> bytes:
    import orjson
    return orjson.dumps(doc)


def bench_kineto(args) -> int:
    """Import of a 1M-event torch.profiler trace, interleaved with a plain json.load of the same file."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OPSCOPE_HOME"] = tmp
        from opscope.profiler.importers import import_trace
        from opscope.profiler.store import RunStore
        store = RunStore(Path(tmp) / "runs.duckdb")
        path = Path(tmp) / "kineto.json"
        n = kineto_trace(path, args.events)
        print(f"torch.profiler trace tiled to {n:,} events ({path.stat().st_size / 2**20:.0f} MiB)")
        imp, cpu, base, cli = [], [], [], []
        phases: dict = {}
        for r in range(args.rounds):
            (t, c), rid = timed(lambda: import_trace(path, store=store), cpu=True)
            imp.append(t)
            cpu.append(c)
            store.delete_run(rid)
            cli.append(cli_import(path))

            def load():
                with open(path) as f:
                    return len(json.load(f)["traceEvents"])
            base.append(timed(load)[0])
            print(f"round {r + 1}/{args.rounds}: import {imp[-1]:.2f} s ({cpu[-1]:.2f} s CPU), "
                  f"`opscope trace import` {cli[-1]:.2f} s, json.load {base[-1]:.2f} s", flush=True)
            if args.phases:
                for k, v in import_phases(store, path).items():
                    phases.setdefault(k, []).append(v)
                print("  import phases (wall / cpu): " + ", ".join(f"{k} {v[-1][0]:.2f} / {v[-1][1]:.2f} s"
                                                                   for k, v in phases.items()), flush=True)
        mi, mb = statistics.median(imp), statistics.median(base)
        print(f"\nmedians over {args.rounds} round(s): import {mi:.2f} s ({n / mi / 1e6:.2f} M events/s), "
              f"CPU {statistics.median(cpu):.2f} s; `opscope trace import` {statistics.median(cli):.2f} s; "
              f"json.load {mb:.2f} s; import / json.load = {mi / mb:.2f}x")
        for k, v in phases.items():
            print(f"  import phase {k:24s} wall {statistics.median(w for w, _ in v):6.2f} s   "
                  f"cpu {statistics.median(c for _, c in v):6.2f} s")
        print("  load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


def cli_import(path: Path) -> float:
    """Wall seconds of `opscope trace import PATH` in a fresh process: what a user waits for, interpreter
    start and module imports included (into the OPSCOPE_HOME this benchmark set)."""
    import subprocess
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from opscope.app.cli import main; "
                    "sys.argv = ['opscope', 'trace', 'import', sys.argv[1]]; main()", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def timed(fn, cpu: bool = False):
    """-> (wall seconds, or (wall, CPU seconds) when cpu, fn's result)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    wall = time.perf_counter() - t
    return ((wall, time.process_time() - c) if cpu else wall), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100k events, one round: a smoke run")
    ap.add_argument("--phases", action="store_true", help="also time each phase of the import once")
    ap.add_argument("--kineto", action="store_true",
                    help="import a torch.profiler trace (shapes, stacks, memory) tiled to --events events instead")
    args = ap.parse_args()
    if args.quick:
        args.events, args.rounds = 100_000, 1
    if args.kineto:
        return bench_kineto(args)

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OPSCOPE_HOME"] = tmp
        from opscope.profiler.export import export
        from opscope.profiler.importers import import_trace
        from opscope.profiler.store import RunStore

        store = RunStore(Path(tmp) / "runs.duckdb")
        t, rid = timed(lambda: make_run(store, args.events))
        print(f"{args.events:,} synthetic events inserted in {t:.2f} s")
        out, pf, base = Path(tmp) / "t.json", Path(tmp) / "t.pftrace", Path(tmp) / "baseline.json"
        res = {k: [] for k in ("export chrome", "export perfetto", "import chrome", "opscope trace import",
                               "baseline json.dump", "baseline json.load")}
        phases: dict = {}
        import_cpu: list = []
        for r in range(args.rounds):          # interleaved, so machine load hits both sides alike
            res["export chrome"].append(timed(lambda: export(store, rid, "chrome", out))[0])

            def dump():
                ev = baseline_events(store, rid)
                with open(base, "w") as f:
                    json.dump({"traceEvents": ev}, f)
            res["baseline json.dump"].append(timed(dump)[0])
            res["export perfetto"].append(timed(lambda: export(store, rid, "perfetto", pf))[0])
            (t, cpu), back = timed(lambda: import_trace(out, store=store), cpu=True)
            res["import chrome"].append(t)
            import_cpu.append(cpu)
            store.delete_run(back)
            res["opscope trace import"].append(cli_import(out))

            def load():
                with open(base) as f:
                    return len(json.load(f)["traceEvents"])
            res["baseline json.load"].append(timed(load)[0])
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in res.items()),
                  flush=True)
            if args.phases:
                for k, v in import_phases(store, out).items():
                    phases.setdefault(k, []).append(v)
                print("  import phases (wall / cpu): " + ", ".join(f"{k} {v[-1][0]:.2f} / {v[-1][1]:.2f} s"
                                                                   for k, v in phases.items()), flush=True)
        med = {k: statistics.median(v) for k, v in res.items()}
        print(f"\nmedians over {args.rounds} round(s), {args.events:,} events "
              f"(chrome {out.stat().st_size / 2**20:.0f} MiB, perfetto {pf.stat().st_size / 2**20:.0f} MiB, "
              f"baseline {base.stat().st_size / 2**20:.0f} MiB):")
        for k, v in med.items():
            print(f"  {k:21s} {v:7.2f} s  ({args.events / v / 1e6:.2f} M events/s)")
        print(f"  export chrome / baseline json.dump   = {med['export chrome'] / med['baseline json.dump']:.2f}x time")
        print(f"  export perfetto / baseline json.dump = {med['export perfetto'] / med['baseline json.dump']:.2f}x time")
        print(f"  import chrome / baseline json.load   = {med['import chrome'] / med['baseline json.load']:.2f}x time"
              " (import also nests, maps names and writes the store)")
        print(f"  import chrome cpu    {statistics.median(import_cpu):7.2f} s  (CPU seconds, all threads: "
              "the import's time on an idle machine)")
        for k, v in phases.items():
            print(f"  import phase {k:24s} wall {statistics.median(w for w, _ in v):6.2f} s   "
                  f"cpu {statistics.median(c for _, c in v):6.2f} s")
        print("  load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
