"""`opscope profile -- torchrun ARGS script.py` (or `-- python -m torch.distributed.run ...`): every rank of an
unchanged distributed job into one multi-rank run (profiler/torchrun.py), then the top ops and the ranks."""
from __future__ import annotations

import sys

from .common import console, emit_json, say, table, terminal_text
from .runs import print_op_table, stats_doc


def main(args, command: list[str], store) -> int:
    from opscope.profiler.ranks import Ranks, is_communication
    from opscope.profiler.torchrun import nothing_recorded, profile_launcher
    run_id, rc = profile_launcher(command, store, engine=args.engine or "native",
                                  stdout=sys.stderr if args.json else None)
    if run_id is None:
        print(f"opscope: error: {nothing_recorded(rc)}", file=sys.stderr)
        return 1
    run = store.get_run(run_id)
    per_rank = {int(r): int(n) for r, n in store.query(
        "SELECT rank, count(*) FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank", [run_id])}
    # the Ranks analysis's one definition of communication (a collective's name), so FSDP2's all-gathers and
    # reduce-scatters, recorded as the ops torch calls rather than through DDP's hooks, count too
    comm = [row for row in store.query(
        "SELECT rank, op, count(*), sum(bytes), sum(end_ns - start_ns), bool_or(phase = 'communication') FROM events "
        "WHERE run_id = ? GROUP BY rank, op ORDER BY rank, op", [run_id]) if row[5] or is_communication(row[1])]
    summary = Ranks.of_run(store, run_id).summary() if run["events"] else {"ranks": [], "slowest_rank": None}
    failed = rc != 0 or run["status"] != "ok"
    doc = {"run_id": run_id, "status": run["status"], "launcher_exit_code": rc, "world_size": run["config"]["world_size"],
           "events": run["events"], "events_per_rank": per_rank, "steps": run["steps"],
           "collectives": [{"rank": int(r), "op": op, "count": int(n), "bytes": int(b or 0), "time_ns": int(t or 0)}
                           for r, op, n, b, t, _ in comm],
           "slowest_rank": summary["slowest_rank"], "ranks": summary["ranks"],
           "top_ops": stats_doc(store.op_stats(run_id)[:args.top], run)}
    if run.get("error"):
        doc["error"] = run["error"]
    if args.json:
        emit_json(doc)
    else:
        print_op_table(run, store.op_stats(run_id)[:args.top], f"top ops of {run['model']} (every rank)")
        console.print(table("ranks", ["rank", "events", "steps", "compute s", "communication s", "idle s"],
                            [[p["rank"], per_rank.get(p["rank"], 0), p["steps"], f"{p['compute_s']:.3f}",
                              f"{p['communication_s']:.3f}", f"{p['idle_s']:.3f}"] for p in summary["ranks"]],
                            justify_right={"events", "steps", "compute s", "communication s", "idle s"}))
        console.print(say("run [bold]{0}[/]: {1} ranks, {2} events; the rank the others wait for most often: {3}. "
                          "`opscope show {0}`, or the Ranks page of `opscope serve`", run_id, doc["world_size"],
                          run["events"], summary["slowest_rank"]))
    if failed:
        why = run.get("error") or f"the launcher exited with code {rc}"
        print(terminal_text(f"opscope: error: run {run_id}: {why} (what the ranks recorded is kept)"),
              file=sys.stderr)
        return 1
    if not run["events"]:
        print(f"opscope: error: run {run_id}: {nothing_recorded(rc)}", file=sys.stderr)
        return 1
    return 0
