"""memplan: liveness-based buffer reuse, planned before the run.

Every value gets a buffer: a view shares its input's, a pointwise op (or fused node) whose input
dies at that op writes into that input's buffer, anything else gets a new one. A buffer is freed
after the last read of any value living in it. The plan's peak -- the most bytes held by live
buffers at any op -- is known when the plan is made (`Plan.peak_bytes`, `Plan.memory_plan`), and
the executor's accounting (what hooks see as `call.live_bytes`) follows the same buffers, so the
run measures exactly the planned peak.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ops import OPS
from .base import Context, Pass, is_inplace, output_slots, pointwise

_TRANSPOSES = frozenset({"transpose", "permute", "t"})
_RESHAPES = frozenset({"view", "reshape", "flatten", "unflatten", "_unsafe_view"})
_FRESH = ("elementwise", "activation", "compute", "normalization", "reduction", "fused")   # kernels that return new arrays


@dataclass
class MemoryPlan:
    alloc: list = field(default_factory=list)        # per step: bytes of new buffers
    free: list = field(default_factory=list)         # per step: bytes of buffers freed after it
    free_after: list = field(default_factory=list)   # per step: slots to drop from the environment
    reuse: list = field(default_factory=list)        # per step: {output index: arg position it writes into}
    peak_bytes: int = 0
    reused: int = 0
    reused_bytes: int = 0
    no_reuse_bytes: int = 0     # every value in its own buffer for the whole run (no liveness at all)

    def summary(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "reused": self.reused, "reused_bytes": self.reused_bytes,
                "no_reuse_bytes": self.no_reuse_bytes}


def _kind(node) -> str:
    if node.op == "transfer":
        return "transfer"
    op = OPS.get(node.op)
    return op.kind if op is not None else "custom"


def plan_memory(assignments, graph, keep: set) -> MemoryPlan:
    """`assignments`: [(node, backend)] in execution order (a placement's, or one backend for all)."""
    external = set(graph.input_slots) | set(graph.constant_slots)
    root: dict[int, int] = {}             # slot -> the slot whose buffer holds it
    where: dict[int, object] = {}         # buffer -> backend
    producer_kind: dict[int, str] = {}
    last: dict[int, int] = {}             # buffer -> index of the last read of any value in it
    last_read: dict[int, int] = {}        # slot -> index of its last read
    for i, (n, _) in enumerate(assignments):
        for s in n.inputs:
            last_read[s] = i
    mp = MemoryPlan()
    strided: set = set()                  # values that are transposed views (a reshape of one copies)
    for i, (n, b) in enumerate(assignments):
        kind = _kind(n)
        reuse = {}
        src = n.inputs[0] if n.inputs else None
        if kind == "view" and n.op in _TRANSPOSES:
            strided.update(n.outputs)
        # NOTE: reshaping a transposed value copies it (numpy's reshape, torch's reshape): a new buffer
        copies = kind == "view" and n.op in _RESHAPES and src in strided
        if kind == "view" and not copies:
            for s in n.outputs:
                root[s] = root.get(src, src) if src is not None else s
                if src in strided:
                    strided.add(s)
        else:
            taken = set()
            for k, s in enumerate(n.outputs):
                j = _reusable(n, k, s, i, graph, root, where, producer_kind, last_read, last, keep, external, b, taken)
                if j is not None:
                    taken.add(n.args[j].slot)
                    root[s] = n.args[j].slot
                    reuse[k] = j
                else:
                    root[s] = s
                    where[s] = b
                    producer_kind[s] = kind
                    mp.no_reuse_bytes += graph.slot_meta[s].nbytes if s in graph.slot_meta else 0
        alloc = sum(graph.slot_meta[s].nbytes for k, s in enumerate(n.outputs)
                    if root.get(s) == s and s in graph.slot_meta)
        for s in list(n.inputs) + list(n.outputs):
            r = root.get(s, s)
            if r not in external:
                last[r] = max(last.get(r, -1), last_read.get(s, i))
        mp.alloc.append(alloc)
        mp.reuse.append(reuse)
        mp.reused += len(reuse)
        mp.reused_bytes += sum(graph.slot_meta[n.outputs[k]].nbytes for k in reuse)
    # frees: each buffer after the last read of anything in it (never: outputs and carried values)
    kept_buffers = {root.get(s, s) for s in keep}
    free = [0] * len(assignments)
    for r, i in last.items():
        if r in kept_buffers or r in external or r not in graph.slot_meta or root.get(r) != r:
            continue
        free[i] += graph.slot_meta[r].nbytes
    mp.free = free
    drops: dict[int, list] = {}
    for s, i in last_read.items():
        if s not in keep and s not in external:
            drops.setdefault(i, []).append(s)
    mp.free_after = [drops.get(i, []) for i in range(len(assignments))]
    live = peak = 0
    for a, f in zip(mp.alloc, mp.free):
        live += a
        peak = max(peak, live)
        live -= f
    mp.peak_bytes = peak
    return mp


def _reusable(n, k, s, i, graph, root, where, producer_kind, last_read, last, keep, external, b, taken):
    """The arg position whose buffer output `k` of node `n` may write into, or None."""
    if is_inplace(n) or s in keep or not (pointwise(n) or n.op == "fused"):
        return None
    out = graph.slot_meta.get(s)
    for j, a in enumerate(n.args):
        t = getattr(a, "slot", None)
        if t is None or t in external or t in keep or t in taken or root.get(t) != t:
            continue
        m = graph.slot_meta.get(t)
        if m is None or out is None or m.shape != out.shape or m.dtype != out.dtype:
            continue
        if where.get(t) is not b or producer_kind.get(t) not in _FRESH + ("transfer",):
            continue
        if last_read.get(t) != i or last.get(t, -1) > i:      # read later, or a view of it is
            continue
        return j
    return None


def inplace_kernel(kernel, reuse: dict, multi: bool, copy):
    """`kernel` writing output k into the buffer of its arg `reuse[k]` (`copy(dst, src)`: the
    backend's MemoryManager.copy), so the value lives where the plan put it."""

    def run(*args, **kwargs):
        out = kernel(*args, **kwargs)
        outs = list(out) if multi else [out]
        for k, j in reuse.items():
            dst = args[j]
            if dst is not outs[k] and _own_buffer(dst, outs[k]):
                copy(dst, outs[k])
                outs[k] = dst
        return outs if multi else outs[0]
    run.reuse = dict(reuse)
    return run


def _own_buffer(dst, src) -> bool:
    """dst is a whole, writable buffer of src's shape and dtype (not a view of something else)."""
    if getattr(dst, "shape", None) != getattr(src, "shape", None) or getattr(dst, "dtype", 0) != getattr(src, "dtype", 1):
        return False
    flags = getattr(dst, "flags", None)
    if flags is not None:                                     # numpy
        return bool(flags.owndata and flags.writeable and flags.c_contiguous)
    return getattr(dst, "_base", 0) is None and dst.is_contiguous()   # torch


def run(graph, ctx: Context) -> list[str]:
    keep = output_slots(graph) | ctx.protected
    mp = plan_memory([(n, ctx.backend) for n in graph.nodes], graph, keep)
    return [f"{mp.reused} value(s) ({mp.reused_bytes} bytes) written into a dying input's buffer; planned peak "
            f"{mp.peak_bytes} bytes of live intermediates, {mp.no_reuse_bytes} with a buffer per value "
            "(the plan after placement has the final figure)"]


PASS = Pass("memplan", (), run, __doc__.strip().splitlines()[0])
