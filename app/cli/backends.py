"""`opscope backends`: every registered backend, whether it runs here, and why not."""
from __future__ import annotations

from .common import add_json, console, emit_json, table


def register(sub) -> None:
    p = sub.add_parser("backends", help="list registered backends and whether they are available")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.runtime.backends import list_backends     # imports torch: not for --help
    rows = list_backends()
    if args.json:
        emit_json({"backends": rows})
        return 0
    t = table("backends", ["spec", "kind", "available", "summary / why not"],
              [[r["spec"], r.get("kind", ""), "yes" if r["available"] else "no",
                r.get("summary", "") if r["available"] else f"not available: {r['reason']}"] for r in rows])
    t.columns[-1].no_wrap = False     # a long "why not" wraps instead of squeezing the spec to "sim…"
    console.print(t)
    return 0
