"""Allocations paired with frees: each buffer's lifetime, what is never freed, and who holds the peak.

    life = lifetimes(store, run)        # None when the run has no allocation it can pair
    life["buffers"]                      # per buffer: alloc_ns, free_ns (None: never freed), bytes, site
    life["sites"]                        # per call site: allocations, bytes, held at the peak, never freed, lifetimes
    life["peak"], life["series"]         # live bytes over time (paired allocations only), its peak

Two sources. A torch.profiler trace recorded with profile_memory=True: its `[memory]` events carry the address
(`Addr`) and a signed size (`Bytes`); an allocation is paired with the next free of the same address on the same
device, as the trace's own memory view does. The importer keeps those args beside the run (importers/extras.py);
each event's call site is the innermost op around it (the memory table's step and seq). An opscope run: the plan
says which step allocates each buffer and which frees it (runtime/buffers.py), repeated every recorded step.

"Never freed" is exact for a plan (kept past the step: an output, a carried value) and means "not freed before
the trace ended" for a trace. A free whose allocation came before the trace started is counted, not paired.
"""
from __future__ import annotations

import numpy as np

OUTSIDE = "(outside any op)"


def lifetimes(store, run: dict) -> dict | None:
    events = _trace_events(store, run) if run.get("engine") == "import" else _plan_events(store, run)
    return pair(*events) if events is not None else None


def pair(t, addr, nbytes, site_of, sites: list[str], device) -> dict | None:
    """Parallel arrays in time order: t (ns), addr, signed bytes (+ allocated, - freed), site index, device.
    -> buffers (paired or never freed), sites, the live series and its peak."""
    t, nbytes = np.asarray(t, np.int64), np.asarray(nbytes, np.int64)
    if not len(t):
        return None
    open_: dict = {}
    a_t, f_t, b, s, dev = [], [], [], [], []
    unpaired_frees = unpaired_bytes = 0
    for i in np.argsort(t, kind="stable").tolist():
        key = (device[i], addr[i])
        if nbytes[i] > 0:
            if key in open_:              # allocated again without a free seen: the first one's end is unknown
                k = open_.pop(key)
                f_t[k] = None
            open_[key] = len(a_t)
            a_t.append(int(t[i]))
            f_t.append(None)
            b.append(int(nbytes[i]))
            s.append(int(site_of[i]))
            dev.append(device[i])
        elif nbytes[i] < 0:
            k = open_.pop(key, None)
            if k is None:
                unpaired_frees += 1
                unpaired_bytes += int(-nbytes[i])
            else:
                f_t[k] = int(t[i])
    if not a_t:
        return None
    alloc = np.asarray(a_t, np.int64)
    freed = np.asarray([x is not None for x in f_t])
    free = np.asarray([x if x is not None else 0 for x in f_t], np.int64)
    size = np.asarray(b, np.int64)
    site = np.asarray(s, np.int64)
    # live bytes of the paired allocations: +bytes at each allocation, -bytes at its free
    times = np.concatenate([alloc, free[freed]])
    delta = np.concatenate([size, -size[freed]])
    order = np.lexsort((delta, times))                 # at one instant, frees before allocations
    times, live = times[order], np.cumsum(delta[order])
    k = int(np.argmax(live))
    t_peak, peak = int(times[k]), int(live[k])
    held = (alloc <= t_peak) & (~freed | (free > t_peak))
    t0 = int(min(alloc.min(), times.min()))
    return {"t0": t0, "t_end": int(times.max()),
            "buffers": {"alloc_ns": alloc, "free_ns": np.where(freed, free, -1), "freed": freed, "bytes": size,
                        "site": site, "device": dev},
            "sites": _by_site(sites, site, size, freed, free - alloc, held), "site_names": list(sites),
            "peak": {"t": t_peak, "bytes": peak, "held_by": _held_by(sites, site, size, held)},
            "series": {"t": times, "live": live},
            "unpaired_frees": unpaired_frees, "unpaired_bytes": unpaired_bytes}


def _by_site(sites, site, size, freed, life, held) -> list[dict]:
    out = []
    for k in np.unique(site).tolist():
        m = site == k
        lf = life[m & freed]
        out.append({"site": sites[k], "index": k, "allocations": int(m.sum()), "bytes": int(size[m].sum()),
                    "at_peak": int(size[m & held].sum()), "never_freed": int((m & ~freed).sum()),
                    "never_freed_bytes": int(size[m & ~freed].sum()),
                    "median_life_ns": float(np.median(lf)) if len(lf) else None,
                    "max_life_ns": int(lf.max()) if len(lf) else None})
    return sorted(out, key=lambda r: (-r["at_peak"], -r["never_freed_bytes"], -r["bytes"]))


def _held_by(sites, site, size, held) -> list[tuple[str, int]]:
    by = np.bincount(site[held], weights=size[held], minlength=len(sites))
    return [(sites[k], int(by[k])) for k in np.argsort(-by).tolist() if by[k] > 0]


# --- a torch.profiler trace -------------------------------------------------------------------------------------

def _trace_events(store, run: dict):
    """The trace's [memory] events (kept by the importer: Addr, Bytes, device) with the op around each."""
    args = _memory_args(store, run["run_id"])
    if not args:
        return None
    rows = store.query("""SELECT m.t_ns, m.backend, e.node, e.module, e.source FROM memory m
                          LEFT JOIN events e ON e.run_id = m.run_id AND e.step = m.step AND e.seq = m.seq
                          WHERE m.run_id = ? ORDER BY m.t_ns""", [run["run_id"]])
    at: dict = {}
    for t, backend, node, module, source in rows:     # the memory rows in trace order, per instant
        at.setdefault(int(t), []).append((backend, _site(node, module, source)))
    names: dict[str, int] = {}
    t_, addr, nbytes, site, device = [], [], [], [], []
    for ts, a in args:
        got = at.get(ts)
        backend, where = got.pop(0) if got else (None, OUTSIDE)
        dev = backend or f"{a.get('Device Type')}:{a.get('Device Id')}"
        if not isinstance(a.get("Addr"), int) or not isinstance(a.get("Bytes"), int):
            continue
        t_.append(ts)
        addr.append(a["Addr"])
        nbytes.append(a["Bytes"])
        site.append(names.setdefault(where, len(names)))
        device.append(dev)
    return t_, addr, nbytes, site, list(names), device


def _memory_args(store, run_id: str) -> list[tuple[int, dict]]:
    """(ts ns, args) of each [memory] event, in trace order, from the importer's extras ([] if none kept)."""
    from opscope.profiler.importers.extras import Extras
    kept = Extras.load(store, run_id)
    return kept.memory() if kept else []


def _site(node, module, source) -> str:
    if not node:
        return OUTSIDE
    where = module or source
    return f"{node} · {where}" if where else str(node)


# --- an opscope run ------------------------------------------------------------------------------------------

def _plan_events(store, run: dict):
    """Each plan buffer of each recorded step: allocated when its op ends, freed when the freeing op ends."""
    cfg = run.get("config") or {}
    place = cfg.get("placement") if isinstance(cfg, dict) else None
    b = place.get("buffers") if isinstance(place, dict) else None
    if not isinstance(b, dict) or not b.get("seq"):
        return None
    rows = store.query("SELECT step, seq, end_ns, node, module, backend FROM events WHERE run_id = ? AND depth = 0",
                       [run["run_id"]])
    by_step: dict = {}
    for step, seq, end, node, module, backend in rows:
        by_step.setdefault(step, {})[seq] = (int(end), node, module, backend)
    names: dict[str, int] = {}
    t_, addr, nbytes, site, device = [], [], [], [], []
    for step in sorted(by_step):
        ev = by_step[step]
        for k, (seq, free, size) in enumerate(zip(b["seq"], b["free"], b["bytes"])):
            if seq not in ev:
                continue
            end, node, module, backend = ev[seq]
            s = names.setdefault(_site(node, module, None), len(names))
            key = (step, k)                   # a buffer of this step: its own "address"
            t_.append(end)
            addr.append(key)
            nbytes.append(int(size))
            site.append(s)
            device.append(backend)
            if free >= 0 and free in ev:
                t_.append(ev[free][0])
                addr.append(key)
                nbytes.append(-int(size))
                site.append(s)
                device.append(backend)
    return (t_, addr, nbytes, site, list(names), device) if t_ else None
