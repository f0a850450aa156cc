"""cse: identical pure nodes (same op, same overload, same arguments) computed twice are computed once."""
from __future__ import annotations

from .base import Context, Pass, output_slots, pure, renumber, replace_uses
from ..graph import Ref


def _key(v):
    if isinstance(v, Ref):
        return ("$ref", v.slot)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(_key(x) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple(sorted((k, _key(x)) for k, x in v.items()))
    if isinstance(v, float) and v != v:
        return ("nan",)
    try:
        hash(v)
        return (type(v).__name__, v)
    except TypeError:
        return ("repr", repr(v))


def run(graph, ctx: Context) -> list[str]:
    changes = []
    keep = output_slots(graph) | ctx.protected
    seen: dict = {}
    kept = []
    for i, n in enumerate(graph.nodes):
        if not pure(n) or n.op == "fused" or any(s in keep for s in n.outputs):
            kept.append(n)
            continue
        key = (n.op, str(n.target), _key(n.args), _key(n.kwargs), n.attrs.get("phase", "forward"))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            kept.append(n)
            continue
        replace_uses(graph, dict(zip(n.outputs, first.outputs)), i + 1)
        changes.append(f"{n.name} computes what {first.name} does ({n.op}): reads {first.name}'s output instead")
    graph.nodes = kept
    renumber(graph)
    return changes


PASS = Pass("cse", (), run, __doc__.strip())
