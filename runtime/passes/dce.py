"""dce: remove no-ops (a view or reshape to the same shape, a cast to the same dtype) and
nodes whose outputs nobody reads."""
from __future__ import annotations

from .base import Context, Pass, is_inplace, output_slots, pure, readers, renumber, replace_uses

# ops that return their input unchanged when the output has the input's shape and dtype
_IDENTITY_WHEN_SAME = frozenset({"view", "alias", "expand", "to", "flatten", "squeeze", "unsqueeze", "slice",
                                 "narrow"})


def run(graph, ctx: Context) -> list[str]:
    changes = []
    keep = output_slots(graph) | ctx.protected
    mutated = {a for n in graph.nodes if is_inplace(n) for a in n.inputs[:1]}
    # 1. no-ops: readers read the input instead
    for i, n in enumerate(list(graph.nodes)):
        if n.op not in _IDENTITY_WHEN_SAME or len(n.outputs) != 1 or not n.inputs or n.multi_output:
            continue
        src, out = n.inputs[0], n.outputs[0]
        a, b = graph.slot_meta.get(src), graph.slot_meta.get(out)
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
            continue
        if out in keep or src in mutated or out in mutated or (n.op == "slice" and not _full_slice(n, a)):
            continue
        replace_uses(graph, {out: src})
        n.attrs["_dead"] = True
        changes.append(f"removed no-op {n.op} {n.name} ({_shape(a)} {a.dtype} unchanged)")
    graph.nodes = [n for n in graph.nodes if not n.attrs.pop("_dead", False)]
    # 2. dead code, last node first so a dead chain goes in one sweep
    users = readers(graph)
    live_reads: dict[int, int] = {s: len(ns) for s, ns in users.items()}
    kept = []
    for n in reversed(graph.nodes):
        used = any(live_reads.get(s, 0) or s in keep for s in n.outputs)
        if used or not pure(n):
            kept.append(n)
            continue
        for s in dict.fromkeys(n.inputs):
            live_reads[s] = live_reads.get(s, 1) - 1
        changes.append(f"removed dead {n.op} {n.name} (its output is never read)")
    graph.nodes = kept[::-1]
    renumber(graph)
    return changes


def _full_slice(n, meta) -> bool:
    """slice(x, dim, 0, end>=size, 1): every element, in order."""
    args = list(n.args) + [None] * 5
    start = n.kwargs.get("start", args[2] if len(n.args) > 2 else 0) or 0
    step = n.kwargs.get("step", args[4] if len(n.args) > 4 else 1) or 1
    return start == 0 and step == 1


def _shape(m) -> str:
    return "x".join(map(str, m.shape)) or "scalar"


PASS = Pass("dce", (), run, __doc__.strip())
