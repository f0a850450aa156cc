"""A run laid out as tracks of strictly nested spans: what every trace viewer needs.

Both exporters (Chrome JSON, Perfetto protobuf) read a run through `load_timeline`, so the two
formats show the same processes, threads, spans and step markers. It reads the run columnar and
never touches one op at a time in Python (a run can hold millions): text columns come back once
per distinct op "kind", numbers as numpy arrays, and flat threads are clamped vectorized.

A process is a (backend, device) pair, and in a run of several ranks one per rank ("rank N": each rank is its
own process, so a viewer keeps their tracks apart); a thread is one recorded thread of that process, named
"collectives" where it holds only communication (a rank's all-reduces and DDP buckets). Viewers
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

STACKS_PROCESS = "python stacks"
# what makes two ops look alike in a trace: all their text (and the thread), not their numbers. A run
# repeats few of these (nodes x steps), so they are read once each, not once per event.
KIND_COLUMNS = ["op", "node", "module", "source", "backend", "device", "thread", "input_shapes", "input_dtypes",
                "output_shapes", "output_dtypes", "fallback", "phase", "fwd_node", "rank"]
# the numbers of each op; the NULL-able ones come with a mask of where they are NULL
NUMBER_COLUMNS = ["step", "seq", "depth", "start_ns", "end_ns"]
NULLABLE_COLUMNS = ["flops", "bytes", "live_bytes"]


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
    kinds: list[dict]                        # distinct KIND_COLUMNS values, plus pid and tid
    # per op, sorted by (tid, start, depth): kind, step, seq, depth, start, end (relative, nested), tid,
    # level and size (nesting level and subtree size in that order), flops, bytes, live_bytes
    ops: dict[str, np.ndarray]
    nulls: dict[str, np.ndarray]             # column -> True where the op's value is NULL (only if any)
    steps: dict[str, np.ndarray]             # tid, step, start, end, first (op index), count: one span per
    #                                          thread per run of consecutive ops of one step
    memory: dict[str, np.ndarray]            # pid, t, live_bytes
    stacks: dict[str, np.ndarray] = field(default_factory=dict)   # tid, start, end, depth, level, size, frame

    @property
    def n_ops(self) -> int:
        return len(self.ops["start"])


def nest(start: np.ndarray, end: np.ndarray, depth: np.ndarray):
    """Clamp the spans of ONE thread (sorted by start, depth) into a strict nesting.

    `depth` says who is whose parent (the instrumentation knows it); times are only trusted within it.
    Returns new (start, end, level, size): level = open spans around it, size = its subtree's span
    count in this order (itself included) -- what a begin/end writer needs to place every end.
    """
    start = start.astype(np.int64, copy=True)
    end = np.maximum(end.astype(np.int64, copy=True), start)
    n = len(start)
    if n == 0 or not depth.any():
        if n:
            # flat (the graph engine): siblings only, vectorized -- each starts after all earlier ones ended
            prev_end = np.maximum.accumulate(end)
            start = np.maximum(start, np.concatenate(([start[0]], prev_end[:-1])))
            end = np.maximum(end, start)
        return start, end, np.zeros(n, np.int64), np.ones(n, np.int64)
    stack: list[int] = []        # indices of open spans, outermost first
    s_list, e_list, d_list = start.tolist(), end.tolist(), depth.tolist()
    level, size = [0] * n, [1] * n
    for i in range(n):
        d, s, e = d_list[i], s_list[i], e_list[i]
        prev_sibling_end = None
        while stack and d_list[stack[-1]] >= d:      # close the previous sibling (and its subtree)
            j = stack.pop()
            size[j] = i - j
            prev_sibling_end = e_list[j]
        if prev_sibling_end is not None and s < prev_sibling_end:
            s = prev_sibling_end
        if stack:                                    # stay inside the parent
            p = stack[-1]
            s = min(max(s, s_list[p]), e_list[p])
            e = min(e, e_list[p])
        s_list[i], e_list[i] = s, max(e, s)
        level[i] = len(stack)
        stack.append(i)
    for j in stack:
        size[j] = n - j
    return (np.asarray(s_list, dtype=np.int64), np.asarray(e_list, dtype=np.int64),
            np.asarray(level, dtype=np.int64), np.asarray(size, dtype=np.int64))


def _process_name(backend, device) -> str:
    backend = backend or "?"
    return f"{backend} ({device})" if device and device != backend else backend


def _frame(con, sql: str, rid: str) -> dict[str, np.ndarray]:
    out = con.execute(sql, [rid]).fetchnumpy()
    return {k: (v.filled(None) if isinstance(v, np.ma.MaskedArray) and v.dtype == object else np.asarray(v))
            for k, v in out.items()}


def _read_run(store, rid: str, with_stacks: bool):
    """-> (kinds as row dicts, per-op columns with a `kind` index, null masks, memory, stacks), one connection.

    Text columns come back once per distinct kind: DuckDB hashes each op's text columns, and the
    distinct rows carry the same hash, so ops map to kinds with one searchsorted.
    """
    kcols = ", ".join(KIND_COLUMNS)
    nums = ", ".join([f"coalesce({c}, 0) AS {c}" for c in ("step", "seq", "depth", "start_ns")] +
                     ["coalesce(end_ns, start_ns, 0) AS end_ns"] +
                     [f"coalesce({c}, 0) AS {c}, {c} IS NULL AS {c}_null" for c in NULLABLE_COLUMNS])
    with store.connect(read_only=True) as con:
        kinds = con.execute(f"SELECT hash({kcols}) AS h, {kcols}, min(start_ns) AS first FROM events "
                            f"WHERE run_id = ? GROUP BY ALL ORDER BY first, h", [rid]).fetchall()
        hashes = np.asarray([k[0] for k in kinds], dtype=np.uint64)
        if len(np.unique(hashes)) == len(kinds):
            ev = con.execute(f"SELECT {nums}, hash({kcols}) AS h FROM events WHERE run_id = ?", [rid]).fetchnumpy()
            ev = {k: np.asarray(v) for k, v in ev.items()}
            order = np.argsort(hashes)
            kind = order[np.searchsorted(hashes[order], ev.pop("h"))]
        else:   # two kinds share a 64-bit hash: match the text itself (slow, and never seen)
            ev = con.execute(f"SELECT {nums}, {kcols} FROM events WHERE run_id = ?", [rid]).fetchnumpy()
            ev = {k: (v.filled(None) if isinstance(v, np.ma.MaskedArray) and v.dtype == object else np.asarray(v))
                  for k, v in ev.items()}
            index = {tuple(k[1:-1]): i for i, k in enumerate(kinds)}
            kind = np.asarray([index[t] for t in zip(*[ev.pop(c).tolist() for c in KIND_COLUMNS])], dtype=np.int64)
        mem = _frame(con, "SELECT t_ns, backend, live_bytes FROM memory WHERE run_id = ? ORDER BY t_ns, step, seq", rid)
        stk = _frame(con, "SELECT t_ns, dur_ns, thread, depth, frame FROM stacks WHERE run_id = ? "
                          "ORDER BY thread, t_ns, depth", rid) if with_stacks else {}
    ev["kind"] = kind.astype(np.int64)
    nulls = {}
    for c in NULLABLE_COLUMNS:
        mask = ev.pop(f"{c}_null").astype(bool)
        if mask.any():
            nulls[c] = mask
    return [dict(zip(KIND_COLUMNS, k[1:-1])) for k in kinds], ev, nulls, mem, stk


def load_timeline(store, run_id: str, with_stacks: bool = True) -> Timeline:
    run = store.get_run(run_id)
    rid = run["run_id"]
    kinds, ev, nulls, mem, stk = _read_run(store, rid, with_stacks)
    imported = run.get("engine") == "import"
    n = len(ev["start_ns"])

    starts = [int(ev["start_ns"].min())] if n else []
    if len(mem.get("t_ns", ())):
        starts.append(mem["t_ns"].min())
    if stk and len(stk.get("t_ns", ())):
        starts.append(stk["t_ns"].min())
    t0 = int(min(starts)) if starts else 0

    # processes and threads, numbered in order of first appearance (ranks in rank order)
    ranks = sorted({int(k["rank"] or 0) for k in kinds})
    per_rank: dict[int, set] = {}
    comm_only: dict[tuple, bool] = {}
    for k in kinds:
        per_rank.setdefault(int(k["rank"] or 0), set()).add((k["backend"], k["device"]))
        key = (int(k["rank"] or 0), k["backend"], k["device"], k["thread"])
        comm_only[key] = comm_only.get(key, True) and k["phase"] == "communication"
    processes: dict[tuple, int] = {}
    names: dict[int, str] = {}
    tracks: dict[tuple, Track] = {}
    for k in sorted(kinds, key=lambda k: int(k["rank"] or 0)) if len(ranks) > 1 else kinds:
        rank = int(k["rank"] or 0)
        key = (rank, k["backend"], k["device"], k["thread"])
        if key not in tracks:
            pkey = (rank, k["backend"], k["device"]) if len(ranks) > 1 else (0, k["backend"], k["device"])
            pid = processes.setdefault(pkey, len(processes) + 1)
            name = _process_name(*pkey[1:])
            if len(ranks) > 1:
                name = f"rank {rank}" if len(per_rank[rank]) == 1 else f"rank {rank}: {name}"
            names[pid] = name
            th = k["thread"]
            thread = "collectives" if comm_only[key] else f"thread {th}" if th is not None else "thread"
            tracks[key] = Track(pid, len(tracks) + 1, names[pid],
                                f"{thread} (rank {rank})" if len(ranks) > 1 else thread, int(th or 0))
        k["pid"], k["tid"] = tracks[key].pid, tracks[key].tid
        # the span's name in the viewer: an imported trace's own (its node: `aten::mm`, a kernel's name), so an
        # export shows what was recorded; opscope's op goes beside it (args.op). opscope's own runs: the op.
        k["name"] = str((k["node"] if imported and k["node"] else k["op"]) or "?")
    tid_of_kind = np.asarray([k["tid"] for k in kinds] or [0], dtype=np.int64)

    tid = tid_of_kind[ev["kind"]] if n else np.zeros(0, np.int64)
    depth = ev["depth"].astype(np.int64)
    rel_start = ev["start_ns"].astype(np.int64) - t0
    rel_end = ev["end_ns"].astype(np.int64) - t0
    # per thread, by start then depth (a parent sorts before a child that starts with it); ties keep the
    # order the ops were recorded in. Skipped when the rows already are in that order (the usual case).
    flat = not depth.any()
    keys = (rel_start,) if flat else (depth, rel_start)
    if len(tracks) > 1:
        keys = keys + (tid,)
    if n and (len(keys) > 1 or np.any(np.diff(rel_start) < 0)):
        order = np.lexsort(keys) if len(keys) > 1 else np.argsort(rel_start, kind="stable")
        ev = {k: v[order] for k, v in ev.items()}
        nulls = {k: v[order] for k, v in nulls.items()}
        tid, depth, rel_start, rel_end = tid[order], depth[order], rel_start[order], rel_end[order]
    new_s, new_e = np.empty_like(rel_start), np.empty_like(rel_end)
    level, size = np.zeros(n, np.int64), np.ones(n, np.int64)
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [n]))):
        if hi > lo:
            new_s[lo:hi], new_e[lo:hi], level[lo:hi], size[lo:hi] = nest(rel_start[lo:hi], rel_end[lo:hi],
                                                                          depth[lo:hi])
    ops = {"kind": ev["kind"], "step": ev["step"].astype(np.int64), "seq": ev["seq"].astype(np.int64),
           "depth": depth, "tid": tid, "start": new_s, "end": new_e, "level": level, "size": size,
           "flops": ev["flops"].astype(np.int64), "bytes": ev["bytes"].astype(np.int64),
           "live_bytes": ev["live_bytes"].astype(np.int64)}

    # one step span per thread and run of consecutive top-level ops of one step: it encloses them
    if n:
        step = ops["step"]
        cut = np.flatnonzero((np.diff(tid) != 0) | ((np.diff(step) != 0) & (level[1:] == 0))) + 1
        first = np.concatenate(([0], cut))
        steps = {"tid": tid[first], "step": step[first], "start": new_s[first],
                 "end": np.maximum.reduceat(new_e, first), "first": first,
                 "count": np.diff(np.concatenate((first, [n])))}
    else:
        steps = {k: np.zeros(0, np.int64) for k in ("tid", "step", "start", "end", "first", "count")}

    memory = _memory(mem, ops, nulls, kinds, processes, t0)
    stacks = _stacks(stk, t0, names, tracks) if stk else {}
    return Timeline(run, t0, names, list(tracks.values()), kinds, ops, nulls, steps, memory, stacks)


def _memory(mem, ops, nulls, kinds, processes, t0) -> dict[str, np.ndarray]:
    """Live bytes over time, one counter per process: the memory table, else the events' live_bytes."""
    if len(mem.get("t_ns", ())):
        pid_of_backend: dict[str, int] = {}
        for (_rank, b, _d), pid in processes.items():
            pid_of_backend.setdefault(b, pid)
        pid = np.asarray([pid_of_backend.get(b, 1) for b in mem["backend"].tolist()], dtype=np.int64)
        live = np.asarray([0 if v is None else v for v in mem["live_bytes"].tolist()], dtype=np.int64)
        return {"pid": pid, "t": np.asarray(mem["t_ns"], dtype=np.int64) - t0, "live_bytes": live}
    keep = ~nulls["live_bytes"] if "live_bytes" in nulls else np.ones(len(ops["start"]), dtype=bool)
    if not keep.any():
        return {"pid": np.zeros(0, np.int64), "t": np.zeros(0, np.int64), "live_bytes": np.zeros(0, np.int64)}
    pid_of_kind = np.asarray([k["pid"] for k in kinds], dtype=np.int64)
    pid, t, live = pid_of_kind[ops["kind"][keep]], ops["end"][keep], ops["live_bytes"][keep]
    if len(t) > 1 and np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        pid, t, live = pid[order], t[order], live[order]
    return {"pid": pid, "t": t, "live_bytes": live}


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
    level, size = np.zeros(len(tid), np.int64), np.ones(len(tid), np.int64)
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(tid)]))):
        start[lo:hi], end[lo:hi], level[lo:hi], size[lo:hi] = nest(start[lo:hi], end[lo:hi], depth[lo:hi])
    return {"tid": tid, "start": start, "end": end, "depth": depth, "level": level, "size": size, "frame": frames}
