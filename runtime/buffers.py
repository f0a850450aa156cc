"""Each buffer a plan allocates, paired with the step that frees it: what the memory page's lifetimes read for
an opscope run (the way torch.profiler's [memory] events pair by address).

    b = buffer_lifetimes(plan)      # {"seq": [...], "free": [...], "bytes": [...]}, one entry per buffer

seq: the plan step (an event's seq) whose output it is; free: the step after which it is dropped, or -1 when
the step keeps it (an output returned to the caller, a value carried to the next step). Bytes follow the
executor's own accounting: an op's outputs, views allocating nothing (Step.alloc_bytes).
"""
from __future__ import annotations


def buffer_lifetimes(plan) -> dict:
    freed_at: dict = {}
    for j, st in enumerate(plan.steps):
        for s in st.free_after:
            freed_at.setdefault(s, j)
    out: dict = {"seq": [], "free": [], "bytes": []}
    for i, st in enumerate(plan.steps):
        if not st.alloc_bytes:          # a view, or an output written into a dying input (the memory plan)
            continue
        for s, meta in zip(st.out_slots, st.node.output_meta):
            nbytes = int(getattr(meta, "nbytes", 0) or 0) if meta is not None else 0
            if nbytes:
                out["seq"].append(i)
                out["free"].append(freed_at.get(s, -1))
                out["bytes"].append(nbytes)
    return out
