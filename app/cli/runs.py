"""`opscope runs`, `opscope show RUN`, `opscope compare RUN_A RUN_B`: the run store, read back."""
from __future__ import annotations

import datetime

from opscope.runtime.errors import UsageError

from .common import add_json, console, count_arg, emit_json, fmt_bytes, fmt_flops, fmt_ns, fmt_ratio, say, table


def register(sub) -> None:
    p = sub.add_parser("runs", help="list profiled runs, newest first")
    p.add_argument("--limit", type=count_arg("--limit", 0), default=50, help="runs to list (default 50)")
    add_json(p)
    p.set_defaults(func=main_runs)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    rm = verbs.add_parser("rm", help="delete runs: by id, older than an age, or all but the newest N",
                          epilog="examples:\n  opscope runs rm 3f2a9c\n  opscope runs rm --older-than 7d\n"
                                 "  opscope runs rm --keep 20")
    rm.add_argument("runs", nargs="*", metavar="RUN", help="run ids (a unique prefix is enough)")
    rm.add_argument("--older-than", metavar="AGE", help="runs started longer ago than AGE: 30m, 12h, 7d, 2w")
    rm.add_argument("--keep", type=count_arg("--keep", 0), metavar="N", help="keep the newest N runs, delete the rest")
    add_json(rm)
    rm.set_defaults(func=main_rm, precheck=_check_rm)

    p = sub.add_parser("show", help="per-op table of one run")
    p.add_argument("run", help="run id (a unique prefix is enough)")
    p.add_argument("--by", choices=["name", "op", "module", "node", "category"], default="name",
                   help="group events by (default name: an imported trace's ops as it names them, aten::mm; "
                        "op: opscope's op types; category: kernels as compute, communication, memory copy/set)")
    p.add_argument("--step", type=int, default=None, help="only this recorded step (0 is the first)")
    p.add_argument("--top", type=count_arg("--top", 0), default=0, help="rows to show (default all)")
    add_json(p)
    p.set_defaults(func=main_show)

    p = sub.add_parser("compare", help="two runs op by op (matched by node), e.g. one model on two backends")
    p.add_argument("run_a", help="run id A (the baseline)")
    p.add_argument("run_b", help="run id B; ratios are B / A")
    p.add_argument("--top", type=count_arg("--top", 0), default=20, help="nodes in the table (default 20)")
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
    # NOTE: the Operators page shows total and self shares of each kind's busy time and the timeline a share of
    # the window: each view names its definition, this one is self time over the whole run's busy time
    cols = [by, "count", "total", "self", "mean", "p50", "p95", "self % of busy", "achieved", "fallback"]
    console.print(table(title, cols, rows, justify_right=set(cols[1:9])))


def main_runs(args) -> int:
    from opscope.profiler import RunStore
    from opscope.profiler.store import StoreError
    store = RunStore()
    try:
        store.refuse_if_damaged()
        runs = store.list_runs()[:args.limit]
    except StoreError as e:
        if not e.damaged:
            raise
        _list_readable(store, args)
        raise
    size = store_bytes(store)
    if args.json:
        emit_json({"runs": runs, "store": {"path": str(store.path), "bytes": size}})
        return 0
    console.print(say("run store {}: {} (`opscope runs rm --older-than 7d` frees space)", store.path, fmt_bytes(size)))
    if not runs:
        console.print("no runs yet: `opscope profile demo:gpt --backend torch:cpu` records one")
        return 0
    rows = [[r["run_id"], _when(r["started_at"]), r["model"], r["backend"], r["engine"], r["status"], r["events"],
             r["dropped"] or ""] for r in runs]
    console.print(table("runs", ["run", "started", "model", "backend", "engine", "status", "events", "dropped"], rows,
                        justify_right={"events", "dropped"}))
    return 0


def _list_readable(store, args) -> None:
    """A damaged store: the runs it still reads, before the one line that says it is damaged."""
    runs, why = store.readable_runs()
    runs = runs[:args.limit]
    if args.json:
        emit_json({"runs": runs, "store": {"path": str(store.path), "bytes": store_bytes(store), "damaged": True}})
        return
    if not runs:
        console.print(say("run store {}: damaged; no run can be read from it ({})", store.path, why or "no runs table"))
        return
    rows = [[r["run_id"], _when(r["started_at"]), r["model"], r["backend"], r["status"], r["events"],
             "yes" if r["readable"] else "no: damaged"] for r in runs]
    console.print(table(f"runs still readable in the damaged store {store.path}",
                        ["run", "started", "model", "backend", "status", "events", "events read"], rows,
                        justify_right={"events"}))


def store_bytes(store) -> int:
    """The run store's size on disk: the database and its write-ahead log."""
    total = 0
    for p in (store.path, store.path.with_name(store.path.name + ".wal")):
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _age(text: str) -> float:
    import re
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not m:
        raise UsageError(f"--older-than {text!r}: give an age such as 30m, 12h, 7d or 2w")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _check_rm(args) -> None:
    """What to delete is named once and well, before the store is opened."""
    chosen = [bool(args.runs), args.older_than is not None, args.keep is not None]
    if sum(chosen) != 1:
        raise UsageError("opscope runs rm: give run ids, or --older-than AGE, or --keep N (one of them)")
    if args.older_than is not None:
        _age(args.older_than)


def main_rm(args) -> int:
    import time

    from opscope.profiler import RunStore
    store = RunStore()
    before = store_bytes(store)
    if args.runs:
        doomed = [store.get_run(r) for r in args.runs]        # an unknown id fails before anything is deleted
    else:
        runs = store.list_runs()                               # newest first
        if args.keep is not None:
            doomed = runs[args.keep:]
        else:
            cutoff = time.time() - _age(args.older_than)
            doomed = [r for r in runs if (r["started_at"] or 0) < cutoff]
    running = [r["run_id"] for r in doomed if r["status"] == "running"]
    if running and args.runs:
        raise UsageError(f"run {running[0]} is still running: stop it first")
    doomed = [r for r in doomed if r["status"] != "running"]   # --keep/--older-than never touch a live run
    for r in doomed:
        store.delete_run(r["run_id"])
    after = store_bytes(store)
    doc = {"deleted": [r["run_id"] for r in doomed], "store": {"path": str(store.path), "bytes": after},
           "bytes_before": before}
    if args.json:
        emit_json(doc)
        return 0
    console.print(f"deleted {len(doomed)} run(s); run store {fmt_bytes(after)}"     # numbers only: no names
                  + (" (DuckDB reuses the freed pages; the file shrinks on its next checkpoint)" if doomed else ""))
    return 0


def main_show(args) -> int:
    from opscope.profiler import RunStore
    store = RunStore()
    run = store.get_run(args.run)
    steps = run.get("steps") or 0
    if args.step is not None and not 0 <= args.step < max(steps, 1):
        raise UsageError(f"--step {args.step}: run {run['run_id']} recorded {steps} step(s), numbered 0 to "
                         f"{max(steps - 1, 0)}")
    stats = store.op_stats(run["run_id"], by=args.by, step=args.step)
    if args.top > 0:
        stats = stats[:args.top]
    ranks = _ranks_doc(store, run)
    if args.json:
        emit_json({"run": run, "by": args.by, "step": args.step, "ops": stats_doc(stats, run), **ranks})
        return 0
    console.print(say("run [bold]{}[/]: {} on {} ({}), {}, {} events, {} step(s), started {}", run["run_id"],
                      run["model"], run["backend"], run["engine"], run["status"], run["events"], run["steps"],
                      _when(run["started_at"])))
    if run.get("error"):
        console.print(say("[red]error:[/] {}", run["error"]))
    if run.get("dropped"):
        console.print(say("[yellow]{} events were dropped by the stream (the collector fell behind)[/]", run["dropped"]))
    # "name" is the trace's own name on an import; on opscope's own runs it is the op
    by = "op" if args.by == "name" and run.get("engine") != "import" else args.by
    print_op_table(run, stats, f"per {by}" + (f", step {args.step}" if args.step is not None else ""), by)
    if ranks.get("slowest_rank") is not None:
        console.print(say("slowest rank: {} (the others waited {:.3f} s for it)", ranks["slowest_rank"],
                          ranks["others_waited_s"]))
    return 0


def _ranks_doc(store, run: dict) -> dict:
    """A run of several ranks: the rank the others waited for (profiler/ranks.py), as the Ranks page names it."""
    ranks = store.query("SELECT count(DISTINCT rank) FROM events WHERE run_id = ?", [run["run_id"]])
    if not ranks or (ranks[0][0] or 0) < 2:
        return {}
    from opscope.profiler.ranks import Ranks
    summary = Ranks.of_run(store, run["run_id"]).summary()
    slow = summary["slowest_rank"]
    waited = next((r["others_waited_s"] for r in summary["ranks"] if r["rank"] == slow), 0.0)
    return {"slowest_rank": slow, "others_waited_s": waited, "ranks": summary["ranks"]}


def main_compare(args) -> int:
    from opscope.profiler import RunStore
    from opscope.profiler.compare import compare_runs
    doc = compare_runs(RunStore(), args.run_a, args.run_b)
    if args.json:
        emit_json(doc)
        return 0
    a, b = doc["a"], doc["b"]
    r = doc["ratio"]
    console.print(say("A {} ({} on {}) vs B {} ({} on {}): {} vs {} per step{}; {} nodes matched", a["run_id"],
                      a["model"], a["backend"], b["run_id"], b["model"], b["backend"], fmt_ns(doc["total_a_ns"]),
                      fmt_ns(doc["total_b_ns"]), f", B/A = {fmt_ratio(r)}" if r else "", doc["matched"]))
    ratio = fmt_ratio
    console.print(table(f"per op, per step (A {doc['steps_a']} step(s), B {doc['steps_b']})",
                        ["op", "A calls", "B calls", "A", "B", "B/A"],
                        [[o["op"], f"{o['a_count']:g}", f"{o['b_count']:g}", fmt_ns(o["a_ns"]), fmt_ns(o["b_ns"]),
                          ratio(o["ratio"])] for o in doc["ops"]],
                        justify_right={"A calls", "B calls", "A", "B", "B/A"}))
    console.print(table(f"nodes with the largest difference (top {args.top})", ["node", "op", "A", "B", "B/A"],
                        [[n["node"], n["op"], fmt_ns(n["a_ns"]), fmt_ns(n["b_ns"]), ratio(n["ratio"])]
                         for n in doc["nodes"][:args.top]], justify_right={"A", "B", "B/A"}))
    for side, key in (("A", "only_a"), ("B", "only_b")):
        if doc[key]:
            names = ", ".join(f"{n['node']} ({n['op']})" for n in doc[key][:20])
            more = f" and {len(doc[key]) - 20} more" if len(doc[key]) > 20 else ""
            console.print(say("only in {}: {}{}", side, names, more))
    return 0
