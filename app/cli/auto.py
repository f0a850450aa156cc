"""-b auto on the command line (runtime/autoplace): --budget, and the tables of what its search chose."""
from __future__ import annotations

import os

from .common import console, count_arg, say, table


def add_budget(p) -> None:
    """--budget for -b auto: how many candidate regions its search may compile and measure."""
    p.add_argument("--budget", type=count_arg("--budget"), metavar="N",
                   help="-b auto: candidate regions its search may compile and measure (default 48)")


def auto_budget(args) -> None:
    """--budget handed to -b auto's search; given with another backend it is refused (one line)."""
    from opscope.runtime import autoplace
    from opscope.runtime.errors import UsageError
    if getattr(args, "budget", None) is None:
        return
    if not autoplace.is_auto(args.backend):
        raise UsageError(f"--budget bounds the search of -b auto; -b {args.backend} does not search: leave --budget out")
    os.environ[autoplace.BUDGET_ENV] = str(autoplace.check_budget(args.budget))


def auto_tables(auto: dict) -> None:
    """-b auto's choice: each segment's stack, its measured time and the runners-up, then the gain over every single
    backend (runtime/autoplace)."""
    if auto.get("note"):
        console.print(say("[yellow]-b auto: {}[/]", auto["note"]))
    ms = lambda t: "-" if t is None else f"{t * 1e3:.3f} ms"   # noqa: E731
    rows = []
    for g in auto["segments"]:
        runners = ", ".join(f"{r['backend']} {ms(r['seconds'])}" if r["seconds"] is not None
                            else f"{r['backend']} ({r['reason'] or r['how']})"[:60] for r in g["runners_up"][:3])
        rows.append([g["module"] or g["first"], g["nodes"], g["backend"], ms(g["seconds"]), runners])
    # the search's times are the process's CPU time (runtime/autoplace/search.py), not the wall clock run reports
    console.print(table("-b auto: segments", ["module", "nodes", "backend", "CPU time", "runners-up"], rows,
                        justify_right={"nodes", "CPU time"}))
    step, search = auto.get("step_seconds"), auto.get("search") or {}
    gains = ", ".join(f"{b} {ms(t)}" + (f" ({auto['gain'][b]:.2f}x)" if b in auto["gain"] else "")
                      for b, t in sorted(auto["single"].items()))
    how = (f"searched in {search.get('seconds', 0):.1f} s, {search.get('candidates_measured', 0)} candidates measured"
           if auto.get("searched") else f"chosen by an earlier search (from the {auto.get('source')}), nothing measured")
    console.print(say("-b auto: step {} of {} ({}); each backend alone: {}", ms(step), auto.get("clock", "CPU time"),
                      how, gains or "-"))
