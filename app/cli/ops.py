"""`opscope ops [--backend B] [--json]`: every opscope op, its kind and dtypes, and which registered
backends run it natively (what placement sends elsewhere is what they do not)."""
from __future__ import annotations

from .common import BACKEND_HELP, add_json, check_specs, console, emit_json, table


def register(sub) -> None:
    p = sub.add_parser("ops", help="list opscope's ops and which backend runs which",
                       description="Every opscope op (the names used in description files, events and reports), "
                                   "its kind and dtypes, and the backends that run it natively. An op a backend "
                                   "does not run goes to its fallback.")
    p.add_argument("--backend", "-b", action="append", default=None, metavar="B",
                   help=f"only this backend ({BACKEND_HELP}); repeatable. Default: every available one")
    p.add_argument("--kind", default=None, help="only ops of this kind (elementwise, reduction, compute, ...)")
    add_json(p)
    p.set_defaults(func=main, precheck=lambda args: check_specs(args, model=None))


def op_table(specs: list[str] | None = None, kind: str | None = None) -> dict:
    """{"backends": [name], "ops": [{op, kind, dtypes, aten, native: [backend], why_not: {backend: reason}}]}."""
    from opscope.runtime.backends import list_backends, resolve
    from opscope.runtime.errors import UsageError
    from opscope.runtime.ops import OPS
    from opscope.runtime.ops.registry import INTERNAL_OPS

    if specs is None:
        specs = [r["spec"] for r in list_backends() if r["available"]]
    backends = [resolve(s, with_fallback=False) for s in specs]     # a bad spec is a usage error here
    kinds = sorted({o.kind for o in OPS.values()})
    if kind is not None and kind not in kinds:
        raise UsageError(f"--kind {kind!r}: kinds are {', '.join(kinds)}")
    claims = {b.name: set(b.ops.ops()) for b in backends}
    rows = []
    for name in sorted(OPS):
        op = OPS[name]
        if name in INTERNAL_OPS:        # nodes opscope inserts (transfers, fused chains), never a model's op
            continue
        if kind is not None and op.kind != kind:
            continue
        native = [b.name for b in backends if name in claims[b.name]]
        why = {b.name: _why_not(b, name) for b in backends if name not in claims[b.name]}
        rows.append({"op": name, "kind": op.kind, "dtypes": sorted(op.dtypes), "aten": list(op.aten),
                     "native": native, "why_not": why})
    return {"backends": [b.name for b in backends], "ops": rows}


def _why_not(backend, op: str) -> str:
    reg = backend.ops
    if op in reg.unsupported:
        return "marked unsupported in its description"
    if reg.supported is not None and op not in reg.supported:
        return "not in its description's supported list"
    return "no kernel"


def main(args) -> int:
    doc = op_table(args.backend, args.kind)
    if args.json:
        emit_json(doc)
        return 0
    names = doc["backends"]
    if len(names) == 1:                   # one backend: say why an op is not native
        rows = [[r["op"], r["kind"], _dtypes(r["dtypes"]), "yes" if r["native"] else "no",
                 r["why_not"].get(names[0], "")] for r in doc["ops"]]
        cols = ["op", "kind", "dtypes", "native", f"why not (goes to the fallback)"]
    else:                                 # one column per backend would not fit 100 columns
        rows = [[r["op"], r["kind"], _dtypes(r["dtypes"]), "all" if len(r["native"]) == len(names) else
                 ", ".join(r["native"]) or "none"] for r in doc["ops"]]
        cols = ["op", "kind", "dtypes", "native on"]
    console.print(table(f"{len(rows)} ops on {', '.join(names)}; an op a backend does not run natively goes to its "
                        "fallback", cols, rows))
    return 0


def _dtypes(dtypes: list[str]) -> str:
    """The full set reads 'all', floats only 'floats': a 10-name list per row would not fit 100 columns."""
    from opscope.runtime.dtypes import FLOATS
    from opscope.runtime.ops.registry import ALL_DTYPES, COMPLEX
    s = set(dtypes)
    if s == set(ALL_DTYPES):
        return "all"
    if s == set(ALL_DTYPES) | set(COMPLEX):
        return "all+complex"
    if s == set(FLOATS):
        return "floats"
    return ",".join(dtypes)
