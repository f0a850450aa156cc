"""`opscope sql RUN "SELECT ..."`: a read-only SQL console over one run's tables (profiler/sql.py says how it is
sandboxed: no file or network access, no extensions, one SELECT, bounded rows and time)."""
from __future__ import annotations

import sys

from .common import add_json, console, emit_json, number_arg, table


def register(sub) -> None:
    from opscope.profiler.sql import MAX_ROWS, SECONDS
    p = sub.add_parser("sql", help="a read-only SQL query over one run's tables (events, stacks, memory, ...)")
    p.add_argument("run", help="a run id (or a unique prefix); `opscope runs` lists them")
    p.add_argument("query", help="one SELECT (or WITH ... SELECT, EXPLAIN); each table is this run's rows")
    p.add_argument("--max-rows", type=number_arg("--max-rows", minimum=1, maximum=1_000_000, whole=True),
                   default=MAX_ROWS, help="rows shown at most (the query is cut there)")
    p.add_argument("--timeout", type=number_arg("--timeout", above=0, maximum=600, unit="seconds"), default=SECONDS,
                   help="seconds before the query is stopped")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.profiler.sql import query
    out = query(args.run, args.query, max_rows=args.max_rows, seconds=args.timeout)
    if args.json:
        emit_json(out)
        return 0
    console.print(table(f"run {out['run']}", out["columns"], [[_cell(v) for v in r] for r in out["rows"]]))
    if out["truncated_by"] == "bytes":
        print(f"opscope: note: only the first {len(out['rows'])} rows are shown: the answer reached "
              f"{out['max_bytes'] // 1024 ** 2} MB of text (select fewer or shorter columns)", file=sys.stderr)
    elif out["truncated"]:
        print(f"opscope: note: only the first {out['max_rows']} rows are shown (--max-rows)", file=sys.stderr)
    return 0


def _cell(v) -> str:
    return "NULL" if v is None else str(v)
