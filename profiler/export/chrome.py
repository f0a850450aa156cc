"""Chrome trace JSON (the Trace Event Format): opens in Perfetto UI, chrome://tracing and speedscope.

    {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}

One `X` event per executed op (cat "op", or "transfer" for copies between backends), one `X` per
step and thread (cat "step") enclosing that step's ops, `M` events naming each process
(backend and device) and thread, `C` counter events for live memory, and the run's Python stacks
(cat "stack") as a process of their own when the run has them. `ts`/`dur` are microseconds from the
run's first timestamp, with three decimals (nanosecond precision).

The file is written in chunks of a few thousand events, each serialized by orjson, so a run of
millions of events never becomes one giant string in memory.
"""
from __future__ import annotations

import gzip as gzip_module
import json

import numpy as np
import orjson

from .timeline import Timeline, load_timeline

CHUNK = 20_000
# event columns that go into an op's args when they hold a value
_ARGS = ["step", "seq", "node", "module", "source", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes",
         "flops", "bytes", "fallback"]


def _us(ns: np.ndarray) -> list[float]:
    return (ns / 1000.0).round(3).tolist()


def _open(path, gzip: bool):
    return gzip_module.open(path, "wb", compresslevel=3) if gzip else open(path, "wb")


def metadata_events(tl: Timeline) -> list[dict]:
    out = []
    for pid, name in tl.processes.items():
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for t in tl.tracks:
        out.append({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid, "args": {"name": t.thread}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": t.pid, "tid": t.tid, "args": {"sort_index": t.tid}})
    return out


def _op_events(tl: Timeline, lo: int, hi: int, pid_of_tid: dict) -> list[dict]:
    ops = tl.ops
    ts = _us(ops["start"][lo:hi])
    dur = _us(ops["end"][lo:hi] - ops["start"][lo:hi])
    tid = ops["tid"][lo:hi].tolist()
    name = ops["op"][lo:hi].tolist()
    cols = {c: _plain(ops[c][lo:hi]) for c in _ARGS}
    # columns with a value everywhere go in with one zip; only the gappy ones are checked per event
    full = [c for c in _ARGS if not any(v is None or v == "" for v in cols[c])]
    gappy = [c for c in _ARGS if c not in full]
    full_rows = zip(*[cols[c] for c in full]) if full else iter(lambda: (), None)
    out = []
    for i, row in zip(range(hi - lo), full_rows):
        args = dict(zip(full, row))
        for c in gappy:
            v = cols[c][i]
            if v is not None and v != "":
                args[c] = v
        op = name[i] or "?"
        out.append({"name": op, "cat": "transfer" if op == "transfer" else "op", "ph": "X", "ts": ts[i],
                    "dur": dur[i], "pid": pid_of_tid[tid[i]], "tid": tid[i], "args": args})
    return out


def _plain(col: np.ndarray) -> list:
    """numpy column -> list of JSON-ready Python values (None stays None)."""
    if col.dtype == object:
        return col.tolist()
    if col.dtype.kind == "f":                    # a NULL integer column comes back as float NaN
        return [None if v != v else int(v) for v in col.tolist()]
    return col.tolist()


def iter_chunks(tl: Timeline):
    """Lists of trace events, in an order viewers like: metadata, then per chunk steps and ops."""
    pid_of_tid = {t.tid: t.pid for t in tl.tracks}
    yield metadata_events(tl)
    st = tl.steps
    if len(st["tid"]):
        ts, dur = _us(st["start"]), _us(st["end"] - st["start"])
        yield [{"name": f"step {s}", "cat": "step", "ph": "X", "ts": ts[i], "dur": dur[i],
                "pid": pid_of_tid[t], "tid": t, "args": {"step": s}}
               for i, (t, s) in enumerate(zip(st["tid"].tolist(), st["step"].tolist()))]
    for lo in range(0, tl.n_ops, CHUNK):
        yield _op_events(tl, lo, min(lo + CHUNK, tl.n_ops), pid_of_tid)
    mem = tl.memory
    for lo in range(0, len(mem["t"]), CHUNK):
        ts = _us(mem["t"][lo:lo + CHUNK])
        yield [{"name": "live memory", "ph": "C", "ts": ts[i], "pid": p, "args": {"live_bytes": b}}
               for i, (p, b) in enumerate(zip(mem["pid"][lo:lo + CHUNK].tolist(),
                                             mem["live_bytes"][lo:lo + CHUNK].tolist()))]
    sk = tl.stacks
    if sk:
        ts, dur = _us(sk["start"]), _us(sk["end"] - sk["start"])
        frames, tids = sk["frame"].tolist(), sk["tid"].tolist()
        yield [{"name": frames[i], "cat": "stack", "ph": "X", "ts": ts[i], "dur": dur[i],
                "pid": pid_of_tid[tids[i]], "tid": tids[i]} for i in range(len(tids))]


def other_data(tl: Timeline) -> dict:
    r = tl.run
    return {"opscope": 1, "run_id": r["run_id"], "model": r.get("model"), "backend": r.get("backend"),
            "device": r.get("device"), "engine": r.get("engine"), "steps": r.get("steps"),
            "t0_ns": tl.t0, "versions": r.get("versions")}


def write_chrome(store, run_id: str, path, gzip: bool = False) -> dict:
    """Write the run as Chrome trace JSON (gzipped when asked). Returns counts for the report."""
    tl = load_timeline(store, run_id)
    n = 0
    with _open(path, gzip) as f:
        f.write(b'{"traceEvents":[')
        first = True
        for chunk in iter_chunks(tl):
            if not chunk:
                continue
            body = orjson.dumps(chunk)[1:-1]       # the list's items, without its brackets
            f.write(body if first else b"," + body)
            first = False
            n += len(chunk)
        f.write(b'],"displayTimeUnit":"ns","otherData":')
        f.write(orjson.dumps(other_data(tl), default=str))
        f.write(b"}")
    return {"run_id": tl.run["run_id"], "ops": tl.n_ops, "steps": int(len(tl.steps["tid"])), "trace_events": n}


def load_chrome(path) -> dict:
    """Read a Chrome trace written by us (plain or gzipped) -- for tests and round trips."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip_module.decompress(data)
    return json.loads(data)
