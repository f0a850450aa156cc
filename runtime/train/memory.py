"""Memory of a training step by category, the way torch.profiler's memory timeline splits it.

    timeline = memory_timeline(trainer)      # {"seq": [...], "parameter": [...], ..., "peak": {...}}

Categories: parameter, optimizer_state, input (resident for the step), and what the step allocates:
gradient (a parameter's gradient), activation (a forward value the backward still reads: live when
the backward starts), temporary (everything else). The optimizer's new parameters and state count
as parameter / optimizer_state: the step computes them beside the old ones (no in-place update).
Bytes follow the executor's own accounting (Step.alloc_bytes / free_after; views allocate nothing),
so the total at a seq is the live intermediates a hook sees plus what is resident.
"""
from __future__ import annotations

from .joint import phase_of

CATEGORIES = ("parameter", "optimizer_state", "input", "gradient", "activation", "temporary")


def memory_timeline(trainer) -> dict:
    """Bytes per category after every plan step (seq) where something changes, and the peak's owner."""
    plan, tg = trainer.plan, trainer.train
    g = tg.graph
    nbytes = lambda s: g.slot_meta[s].nbytes if s in g.slot_meta else 0  # noqa: E731
    grads = set(tg.joint.grad_slots.values())
    for st in reversed(plan.steps):      # a gradient that is a view (t of an mm): its memory is the base's
        if not st.alloc_bytes and grads.intersection(st.out_slots):
            grads.update(st.node.inputs)
    new_params = set(tg.new_params.values())
    state_out = {o for p, o in tg.carry.items() if o not in new_params and p not in tg.joint.buffer_slots.values()}
    activations = activation_slots(plan)
    resident = {"parameter": sum(nbytes(s) for s in tg.joint.param_slots.values()),
                "optimizer_state": sum(nbytes(s) for slots in tg.state_slots.values() for s in slots),
                "input": sum(nbytes(s) for s in g.input_slots)}
    resident["parameter"] += sum(nbytes(s) for s in tg.joint.buffer_slots.values())   # batch-norm stats
    now = {c: resident.get(c, 0) for c in CATEGORIES}
    cat_of: dict[int, str] = {}
    out = {"seq": [], **{c: [] for c in CATEGORIES}}
    peak_total, peak = -1, {}
    for seq, st in enumerate(plan.steps):
        changed = False
        if st.alloc_bytes:
            for s in st.out_slots:
                c = ("gradient" if s in grads else "parameter" if s in new_params else
                     "optimizer_state" if s in state_out else "activation" if s in activations else "temporary")
                cat_of[s] = c
                now[c] += nbytes(s)
                changed = True
        total = sum(now.values())
        if total > peak_total:
            peak_total, peak = total, {"seq": seq, "node": st.node.name, **now}
        for s in st.free_after:
            c = cat_of.pop(s, None)
            if c is not None:
                now[c] -= nbytes(s)
                changed = True
        if changed or seq == 0:
            out["seq"].append(seq)
            for c in CATEGORIES:
                out[c].append(now[c])
    owner = max(CATEGORIES, key=lambda c: peak.get(c, 0)) if peak else ""
    out["peak"] = {"bytes": max(peak_total, 0), "owner": owner, **peak}
    return out


def activation_slots(plan) -> set[int]:
    """Forward values still live when the first backward step runs (what the backward reads)."""
    live: set[int] = set()
    for st in plan.steps:
        if phase_of(st.node) != "forward" and st.node.op != "transfer":
            break
        if st.alloc_bytes:
            live.update(st.out_slots)
        live.difference_update(st.free_after)
    return live
