"""`opscope runs`, `opscope show RUN`, `opscope compare RUN_A RUN_B`: the run store, read back."""
from __future__ import annotations

import datetime

from .common import add_json, console, emit_json, fmt_flops, fmt_ns, table


def register(sub) -> None:
    p = sub.add_parser("runs", help="list profiled runs, newest first")
    p.add_argument("--limit", type=int, default=50, help="runs to list (default 50)")
    add_json(p)
    p.set_defaults(func=main_runs)

    p = sub.add_parser("show", help="per-op table of one run")
    p.add_argument("run", help="run id (a unique prefix is enough)")
    p.add_argument("--by", choices=["op", "module", "node"], default="op", help="group events by (default op)")
    p.add_argument("--step", type=int, default=None, help="only this recorded step")
    p.add_argument("--top", type=int, default=0, help="rows to show (default all)")
    add_json(p)
    p.set_defaults(func=main_show)

    p = sub.add_parser("compare", help="two runs op by op (matched by node), e.g. one model on two backends")
    p.add_argument("run_a", help="run id A (the baseline)")
    p.add_argument("run_b", help="run id B; ratios are B / A")
    p.add_argument("--top", type=int, default=20, help="nodes in the table (default 20)")
    add_json(p)
    p.set_defaults(func=main_compare)


def _when(t) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else ""


def stats_doc(stats: list[dict], run: dict) -> list[dict]:
    steps = max(run.get("steps") or 1, 1)
    return [{**s, "per_step_ns": s["total_ns"] / steps} for s in stats]


def print_op_table(run: dict, stats: list[dict], title: str, by: str = "op") -> None:
    rows = [[s["key"], s["count"], fmt_ns(s["total_ns"]), fmt_ns(s["self_ns"]), fmt_ns(s["mean_ns"] or 0),
             fmt_ns(s["p50_ns"] or 0), fmt_ns(s["p95_ns"] or 0), f"{100 * s['share']:.1f}%",
             fmt_flops(s["achieved_flops"] or 0) if s["flops"] else "", "yes" if s["fallback"] else ""]
            for s in stats]
    cols = [by, "count", "total", "self", "mean", "p50", "p95", "share", "achieved", "fallback"]
    console.print(table(title, cols, rows, justify_right=set(cols[1:9])))


def main_runs(args) -> int:
    from opscope.profiler import RunStore
    runs = RunStore().list_runs()[:max(args.limit, 0)]
    if args.json:
        emit_json({"runs": runs})
        return 0
    if not runs:
        console.print("no runs yet: `opscope profile demo:gpt --backend torch:cpu` records one")
        return 0
    rows = [[r["run_id"], _when(r["started_at"]), r["model"], r["backend"], r["engine"], r["status"], r["events"],
             r["dropped"] or ""] for r in runs]
    console.print(table("runs", ["run", "started", "model", "backend", "engine", "status", "events", "dropped"], rows,
                        justify_right={"events", "dropped"}))
    return 0


def main_show(args) -> int:
    from opscope.profiler import RunStore
    store = RunStore()
    run = store.get_run(args.run)
    stats = store.op_stats(run["run_id"], by=args.by, step=args.step)
    if args.top > 0:
        stats = stats[:args.top]
    if args.json:
        emit_json({"run": run, "by": args.by, "step": args.step, "ops": stats_doc(stats, run)})
        return 0
    console.print(f"run [bold]{run['run_id']}[/]: {run['model']} on {run['backend']} ({run['engine']}), "
                  f"{run['status']}, {run['events']} events, {run['steps']} step(s), started {_when(run['started_at'])}")
    if run.get("error"):
        console.print(f"[red]error:[/] {run['error']}")
    if run.get("dropped"):
        console.print(f"[yellow]{run['dropped']} events were dropped by the stream (the collector fell behind)[/]")
    print_op_table(run, stats, f"per {args.by}" + (f", step {args.step}" if args.step is not None else ""), args.by)
    return 0


def main_compare(args) -> int:
    from opscope.profiler import RunStore
    from opscope.profiler.compare import compare_runs
    doc = compare_runs(RunStore(), args.run_a, args.run_b)
    if args.json:
        emit_json(doc)
        return 0
    a, b = doc["a"], doc["b"]
    r = doc["ratio"]
    console.print(f"A {a['run_id']} ({a['model']} on {a['backend']}) vs B {b['run_id']} ({b['model']} on "
                  f"{b['backend']}): {fmt_ns(doc['total_a_ns'])} vs {fmt_ns(doc['total_b_ns'])} per step"
                  + (f", B/A = {r:.2f}x" if r else "") + f"; {doc['matched']} nodes matched")

    def ratio(x):
        return f"{x:.2f}x" if x is not None else "-"
    console.print(table("per op (matched nodes)", ["op", "nodes", "A", "B", "B/A"],
                        [[o["op"], o["nodes"], fmt_ns(o["a_ns"]), fmt_ns(o["b_ns"]), ratio(o["ratio"])]
                         for o in doc["ops"]], justify_right={"nodes", "A", "B", "B/A"}))
    console.print(table(f"nodes with the largest difference (top {args.top})", ["node", "op", "A", "B", "B/A"],
                        [[n["node"], n["op"], fmt_ns(n["a_ns"]), fmt_ns(n["b_ns"]), ratio(n["ratio"])]
                         for n in doc["nodes"][:args.top]], justify_right={"A", "B", "B/A"}))
    for side, key in (("A", "only_a"), ("B", "only_b")):
        if doc[key]:
            names = ", ".join(f"{n['node']} ({n['op']})" for n in doc[key][:20])
            more = f" and {len(doc[key]) - 20} more" if len(doc[key]) > 20 else ""
            console.print(f"only in {side}: {names}{more}")
    return 0
