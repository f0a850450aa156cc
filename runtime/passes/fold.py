"""fold: an op whose inputs are all constants (weights, buffers, literals) runs once, here, with
the op's own ATen kernel, and its output becomes a constant. Random ops, values a training step
replaces (parameters, optimizer state) and results much larger than their inputs are left alone."""
from __future__ import annotations

import torch

from .base import Context, Pass, output_slots, pure, renumber
from ..graph import Ref

MAX_GROWTH = 1 << 20        # a folded value may exceed its inputs by at most this many bytes


def _values(v, consts):
    if isinstance(v, Ref):
        return consts[v.slot]
    if isinstance(v, (list, tuple)):
        return type(v)(_values(x, consts) for x in v)
    return v


def run(graph, ctx: Context) -> list[str]:
    changes = []
    keep = output_slots(graph) | ctx.protected
    consts = {s: t for s, t in graph.constant_slots.items()
              if isinstance(t, torch.Tensor) and s not in ctx.volatile}
    kept = []
    for n in graph.nodes:
        ok = pure(n) and n.op != "fused" and isinstance(n.target, torch._ops.OpOverload) and \
            all(s in consts for s in n.inputs) and not any(s in keep for s in n.outputs) and \
            all(m is not None for m in n.output_meta)
        grow = sum(m.nbytes for m in n.output_meta if m is not None) - \
            sum(graph.slot_meta[s].nbytes for s in set(n.inputs) if s in graph.slot_meta)
        if not ok or grow > MAX_GROWTH:
            kept.append(n)
            continue
        try:
            with torch.no_grad():
                out = n.target(*_values(n.args, consts), **_values(n.kwargs, consts))
        except Exception:        # an op that cannot run on the host at compile time stays an op
            kept.append(n)
            continue
        outs = list(out) if n.multi_output else [out]
        if len(outs) != len(n.outputs) or not all(isinstance(t, torch.Tensor) for t in outs):
            kept.append(n)
            continue
        for s, t in zip(n.outputs, outs):
            t = t.detach().clone()          # its own storage: a view of a weight must not alias it
            graph.constant_slots[s] = consts[s] = t
        changes.append(f"folded {n.op} {n.name} into a constant ({'x'.join(map(str, outs[0].shape)) or 'scalar'})")
    graph.nodes = kept
    renumber(graph)
    return changes


PASS = Pass("fold", (), run, __doc__.strip())
