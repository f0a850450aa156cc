"""A run laid out as tracks of strictly nested spans: what every trace viewer needs.

Both exporters (Chrome JSON, Perfetto protobuf) read a run through `load_timeline`, so the two
formats show the same processes, threads, spans and step markers.

A process is a (backend, device) pair; a thread is one recorded thread of that process. Viewers
want small integers, so pids and tids are renumbered from 1 (tids are unique across the whole
trace, which Perfetto requires and Chrome accepts) and the original ids go into the names.

Viewers also need strict nesting: a span on a thread either contains another or ends before it
starts. Clocks do not promise that (device timestamps, coarse timers), so `nest` clamps: a child
is cut to its parent's end and a sibling starts no earlier than the previous sibling ended.
Times become nanoseconds relative to the run's first timestamp, so microseconds with three
decimals keep full precision in a double.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opscope.profiler.schema import EVENT_COLUMNS

OP_COLUMNS = EVENT_COLUMNS[1:]
STACKS_PROCESS = "python stacks"


@dataclass
class Track:
    pid: int
    tid: int
    process: str        # process name shown by the viewer
    thread: str         # thread name shown by the viewer
    thread_id: int      # the thread id recorded in the run


@dataclass
class Timeline:
    run: dict
    t0: int                                  # ns subtracted from every timestamp
    processes: dict[int, str]                # pid -> name
    tracks: list[Track]
    ops: dict[str, np.ndarray]               # events columns, plus tid, start, end (relative, nested), order
    steps: dict[str, np.ndarray]             # tid, step, start, end: one span per thread per step
    memory: dict[str, np.ndarray]            # pid, t, live_bytes
    stacks: dict[str, np.ndarray] = field(default_factory=dict)   # tid, start, end, depth, frame

    @property
    def n_ops(self) -> int:
        return len(self.ops["start"])


def nest(start: np.ndarray, end: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clamp the spans of ONE thread (sorted by start, depth) into a strict nesting. Returns new arrays.

    `depth` says who is whose parent (the instrumentation knows it); times are only trusted within it.
    """
    start = start.astype(np.int64, copy=True)
    end = np.maximum(end.astype(np.int64, copy=True), start)
    if len(start) == 0:
        return start, end
    if not depth.any():
        # flat (the graph engine): siblings only, vectorized -- each starts after all earlier ones ended
        prev_end = np.maximum.accumulate(end)
        floor = np.concatenate(([start[0]], prev_end[:-1]))
        start = np.maximum(start, floor)
        end = np.maximum(end, start)
        return start, end
    stack: list[int] = []        # indices of open spans, outermost first
    s_list, e_list, d_list = start.tolist(), end.tolist(), depth.tolist()
    for i in range(len(s_list)):
        d, s, e = d_list[i], s_list[i], e_list[i]
        prev_sibling_end = None
        while stack and d_list[stack[-1]] >= d:      # close the previous sibling (and its subtree)
            prev_sibling_end = e_list[stack.pop()]
        if prev_sibling_end is not None and s < prev_sibling_end:
            s = prev_sibling_end
        if stack:                                    # stay inside the parent
            p = stack[-1]
            s = min(max(s, s_list[p]), e_list[p])
            e = min(e, e_list[p])
        s_list[i], e_list[i] = s, max(e, s)
        stack.append(i)
    return np.asarray(s_list, dtype=np.int64), np.asarray(e_list, dtype=np.int64)


def _process_name(backend, device) -> str:
    backend = backend or "?"
    return f"{backend} ({device})" if device and device != backend else backend


def load_timeline(store, run_id: str, with_stacks: bool = True) -> Timeline:
    run = store.get_run(run_id)
    rid = run["run_id"]
    ev = store.events_frame(rid)
    mem = store.memory_frame(rid)
    stk = store.stacks_frame(rid) if with_stacks else {}
    n = len(ev["start_ns"])

    starts = [ev["start_ns"].min()] if n else []
    if len(mem.get("t_ns", ())):
        starts.append(mem["t_ns"].min())
    if stk and len(stk.get("t_ns", ())):
        starts.append(stk["t_ns"].min())
    t0 = int(min(starts)) if starts else 0

    # processes and threads, numbered in order of first appearance
    processes: dict[tuple, int] = {}
    names: dict[int, str] = {}
    tracks: dict[tuple, Track] = {}
    backend = ev["backend"].tolist() if n else []
    device = ev["device"].tolist() if n else []
    thread = ev["thread"].tolist() if n else []
    tid_of = np.empty(n, dtype=np.int64)
    cache: dict[tuple, int] = {}
    for i in range(n):
        key = (backend[i], device[i], thread[i])
        tid = cache.get(key)
        if tid is None:
            pkey = (backend[i], device[i])
            pid = processes.setdefault(pkey, len(processes) + 1)
            names[pid] = _process_name(*pkey)
            tid = len(tracks) + 1
            th = thread[i]
            tracks[key] = Track(pid, tid, names[pid], f"thread {th}" if th is not None else "thread", int(th or 0))
            cache[key] = tid
        tid_of[i] = tid

    depth = np.asarray(ev["depth"], dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    rel_start = ev["start_ns"].astype(np.int64) - t0 if n else np.zeros(0, dtype=np.int64)
    rel_end = ev["end_ns"].astype(np.int64) - t0 if n else np.zeros(0, dtype=np.int64)
    # per thread, by start then depth (a parent sorts before a child that starts with it)
    order = np.lexsort((depth, rel_start, tid_of)) if n else np.zeros(0, dtype=np.int64)
    s_sorted, e_sorted, d_sorted, t_sorted = rel_start[order], rel_end[order], depth[order], tid_of[order]
    bounds = np.flatnonzero(np.diff(t_sorted)) + 1 if n else []
    new_s, new_e = np.empty_like(s_sorted), np.empty_like(e_sorted)
    for lo, hi in zip(np.concatenate(([0], bounds)) if n else [], np.concatenate((bounds, [n])) if n else []):
        new_s[lo:hi], new_e[lo:hi] = nest(s_sorted[lo:hi], e_sorted[lo:hi], d_sorted[lo:hi])

    ops = {c: np.asarray(ev[c])[order] for c in OP_COLUMNS} if n else {c: np.zeros(0) for c in OP_COLUMNS}
    ops.update(tid=t_sorted, start=new_s, end=new_e, depth=d_sorted)

    # one step span per (thread, step), enclosing that step's ops on that thread
    steps = {"tid": np.zeros(0, np.int64), "step": np.zeros(0, np.int64), "start": np.zeros(0, np.int64),
             "end": np.zeros(0, np.int64)}
    if n:
        step = np.asarray(ops["step"], dtype=np.int64)
        key = np.lexsort((step, t_sorted))
        kt, ks = t_sorted[key], step[key]
        cut = np.flatnonzero((np.diff(kt) != 0) | (np.diff(ks) != 0)) + 1
        firsts = np.concatenate(([0], cut))
        steps = {"tid": kt[firsts], "step": ks[firsts],
                 "start": np.minimum.reduceat(new_s[key], firsts), "end": np.maximum.reduceat(new_e[key], firsts)}

    memory = _memory(mem, ev, processes, t0)
    stacks = _stacks(stk, t0, names, tracks) if stk else {}
    return Timeline(run, t0, names, list(tracks.values()), ops, steps, memory, stacks)


def _memory(mem, ev, processes, t0) -> dict[str, np.ndarray]:
    """Live bytes over time, one counter per process: the memory table, else the events' live_bytes."""
    pid_of_backend: dict[str, int] = {}
    for (b, _d), pid in processes.items():
        pid_of_backend.setdefault(b, pid)
    if len(mem.get("t_ns", ())):
        backends, t, live = mem["backend"].tolist(), mem["t_ns"], mem["live_bytes"]
    elif len(ev.get("start_ns", ())):
        live = ev["live_bytes"]
        keep = np.asarray([v is not None for v in live.tolist()], dtype=bool) if live.dtype == object else \
            np.ones(len(live), dtype=bool)
        backends, t, live = np.asarray(ev["backend"])[keep].tolist(), ev["end_ns"][keep], live[keep]
    else:
        return {"pid": np.zeros(0, np.int64), "t": np.zeros(0, np.int64), "live_bytes": np.zeros(0, np.int64)}
    pid = np.asarray([pid_of_backend.get(b, 1) for b in backends], dtype=np.int64)
    live = np.asarray([0 if v is None else v for v in live.tolist()], dtype=np.int64)
    return {"pid": pid, "t": np.asarray(t, dtype=np.int64) - t0, "live_bytes": live}


def _stacks(stk, t0, names, tracks) -> dict[str, np.ndarray]:
    """Sampled Python stacks as one more process, a thread per sampled thread."""
    if not len(stk.get("t_ns", ())):
        return {}
    pid = max(names, default=0) + 1
    names[pid] = STACKS_PROCESS
    threads = stk["thread"].tolist()
    tid_of: dict = {}
    for th in threads:
        if th not in tid_of:
            tid_of[th] = len(tracks) + 1
            tracks[("stacks", th)] = Track(pid, tid_of[th], STACKS_PROCESS, f"python thread {th}", int(th or 0))
    tid = np.asarray([tid_of[th] for th in threads], dtype=np.int64)
    start = stk["t_ns"].astype(np.int64) - t0
    end = start + np.asarray(stk["dur_ns"], dtype=np.int64)
    depth = np.asarray(stk["depth"], dtype=np.int64)
    order = np.lexsort((depth, start, tid))
    tid, start, end, depth = tid[order], start[order], end[order], depth[order]
    frames = np.asarray(stk["frame"], dtype=object)[order]
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(tid)]))):
        start[lo:hi], end[lo:hi] = nest(start[lo:hi], end[lo:hi], depth[lo:hi])
    return {"tid": tid, "start": start, "end": end, "depth": depth, "frame": frames}
