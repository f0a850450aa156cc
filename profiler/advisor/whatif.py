"""What-if: how long a run would take after a change, from description files, before running anything.

Every estimate goes through `opscope.runtime.roofline.op_seconds` -- the function the sim clock
uses -- so an estimate for a sim backend is exactly what `--apply` will measure there, and any
difference the apply step reports comes from the change itself (fallbacks, dtype support).
"""
from __future__ import annotations

from opscope.runtime.description import Description
from opscope.runtime.dtypes import ITEMSIZE
from opscope.runtime.roofline import op_seconds

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def has_roofline(d: Description | None) -> bool:
    """Only a description with peaks and a bandwidth can predict time."""
    return bool(d is not None and d.peak_flops and d.memory_bandwidth)


def event_seconds(ev: dict, d: Description, *, dtype: str | None = None) -> float:
    """Roofline time of one recorded op on `d`; with `dtype`, as if its float tensors were that dtype."""
    nbytes, cur = ev["bytes"], ev["dtype"]
    if dtype and cur in FLOAT_DTYPES and dtype != cur:
        nbytes = int(nbytes * ITEMSIZE.get(dtype, 4) / ITEMSIZE.get(cur, 4))
        cur = dtype
    return op_seconds(ev["flops"], nbytes, cur, d, transfer=ev["op"] == "transfer")


def dtype_estimate(events: list[dict], d: Description, dtype: str) -> dict:
    """Time of the run's native ops in `dtype` vs as recorded; fallback ops keep their measured time."""
    before = after = 0.0
    for ev in events:
        if ev["fallback"] and ev["op"] != "transfer":
            continue
        before += event_seconds(ev, d)
        after += event_seconds(ev, d, dtype=dtype)
    return {"before_seconds": before, "after_seconds": after, "gain_seconds": max(before - after, 0.0)}


def native_seconds(events: list[dict], d: Description) -> float:
    """What fallback events would take if the primary chip ran them itself."""
    if not has_roofline(d):
        return sum(ev["seconds"] for ev in events)   # no model of the chip: assume the same speed
    return sum(event_seconds(ev, d) for ev in events)


def backend_estimate(events: list[dict], target: Description) -> dict:
    """The whole run on another described chip: its roofline for the ops it supports; the rest keep
    their measured time and pay a host round trip for their inputs and outputs."""
    total = 0.0
    unsupported = set()
    for ev in events:
        if ev["op"] == "transfer":
            continue                      # placement on the target decides its own transfers
        if not _supports(target, ev["op"]):
            unsupported.add(ev["op"])
            bw = target.host_bandwidth or target.memory_bandwidth or 1e10
            total += ev["seconds"] + ev["bytes"] / bw
        else:
            total += event_seconds(ev, target)
    return {"seconds": total, "unsupported": sorted(unsupported)}


def _supports(d: Description, op: str) -> bool:
    if op in d.unsupported:
        return False
    return d.supported is None or op in d.supported
