"""Chrome trace JSON (the Trace Event Format): opens in Perfetto UI, chrome://tracing and speedscope.

    {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}

One `X` event per executed op (cat: its phase, forward / backward / optimizer, or "transfer" for copies
between backends; args.fwd_node names the forward op a backward op differentiates; a fused node's
args.members lists the ops it ran, each with its node, module path and source line), one `X` per
step and thread (cat "step") enclosing that step's ops, `M` events naming each process
(backend and device) and thread, `C` counter events for live memory, and the run's Python stacks
(cat "stack") as a process of their own when the run has them. `ts`/`dur` are microseconds from the
run's first timestamp, with three decimals (nanosecond precision).

The file is written in chunks. Op events, which are nearly all of a big trace, are not built as
dicts: each distinct op kind (rows.py) gets its JSON prefix once -- name, pid, tid and the args
that do not change between steps -- and the numbers of a chunk (step, seq, FLOPs, bytes, ts, dur)
are printed by numpy into fixed-width, space-padded rows. Memory counters are written the same way.
"""
from __future__ import annotations

import gzip as gzip_module
import json

import numpy as np
import orjson

from ..stats import fused_members, members_of
from . import open_output
from .rows import fixed_rows, row_parts
from .timeline import Timeline, load_timeline

CHUNK = 100_000
# kind columns that go into an op's args when they hold a value (fallback always does)
_STATIC_ARGS = ["node", "module", "source", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "phase",
                "fwd_node"]


def _us(ns: np.ndarray) -> list[float]:
    return (ns / 1000.0).round(3).tolist()


def metadata_events(tl: Timeline) -> list[dict]:
    out = []
    for pid, name in tl.processes.items():
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for t in tl.tracks:
        out.append({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid, "args": {"name": t.thread}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": t.pid, "tid": t.tid, "args": {"sort_index": t.tid}})
    return out


def _op_prefixes(tl: Timeline) -> np.ndarray:
    """Per kind: ',{"name":..,"cat":..,"ph":"X","pid":..,"tid":..,"args":{<args that never change>' as bytes."""
    out = []
    fused = fused_members(tl.run)
    for k in tl.kinds:
        op = k["op"] or "?"
        args = {c: k[c] for c in _STATIC_ARGS if k[c] is not None and k[c] != ""}
        if k["name"] != op:
            args["op"] = op                 # an import's name is the trace's: opscope's op type goes beside it
        args["fallback"] = bool(k["fallback"])
        if op == "fused" and k["node"]:     # the ops the one kernel ran: op, node, module path, source line
            args["members"] = members_of(fused, k["node"])
        # the category is the phase (forward / backward / optimizer): viewers filter and color by it
        cat = "transfer" if op == "transfer" else k["phase"] or "forward"
        head = orjson.dumps({"name": k["name"], "cat": cat, "ph": "X", "pid": k["pid"], "tid": k["tid"]})[:-1]
        out.append(b"," + head + b',"args":{' + orjson.dumps(args)[1:-1])
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def _op_parts(tl: Timeline, prefixes: np.ndarray, lo: int, hi: int) -> list[bytes]:
    """Ops lo..hi as ',{...},{...}': the kind's prefix, then the numbers as fixed-width JSON."""
    ops, nulls = tl.ops, tl.nulls
    sl = slice(lo, hi)
    start = ops["start"][sl]
    rows = fixed_rows(hi - lo, [
        (b',"step":', ops["step"][sl], 0, None),
        (b',"seq":', ops["seq"][sl], 0, None),
        (b',"flops":', ops["flops"][sl], 0, nulls["flops"][sl] if "flops" in nulls else None),
        (b',"bytes":', ops["bytes"][sl], 0, nulls["bytes"][sl] if "bytes" in nulls else None),
        (b'},"ts":', start, 3, None),
        (b',"dur":', ops["end"][sl] - start, 3, None),
        b"}"])
    return row_parts(prefixes[ops["kind"][sl]].tolist(), rows)


def _memory_parts(tl: Timeline, lo: int, hi: int) -> list[bytes]:
    mem = tl.memory
    prefix = {int(p): b',{"name":"live memory","ph":"C","pid":%d,"args":{"live_bytes":' % p
              for p in np.unique(mem["pid"][lo:hi]).tolist()}
    rows = fixed_rows(hi - lo, [(b"", mem["live_bytes"][lo:hi], 0, None), (b'},"ts":', mem["t"][lo:hi], 3, None),
                                b"}"])
    return row_parts([prefix[p] for p in mem["pid"][lo:hi].tolist()], rows)


def _dicts(events: list[dict]) -> list[bytes]:
    return [b"," + orjson.dumps(events)[1:-1]] if events else []


def iter_chunks(tl: Timeline):
    """Trace events as lists of bytes, each event preceded by ',': metadata, steps, ops, memory, stacks."""
    pid_of_tid = {t.tid: t.pid for t in tl.tracks}
    yield _dicts(metadata_events(tl))
    st = tl.steps
    if len(st["tid"]):
        ts, dur = _us(st["start"]), _us(st["end"] - st["start"])
        yield _dicts([{"name": f"step {s}", "cat": "step", "ph": "X", "ts": ts[i], "dur": dur[i],
                       "pid": pid_of_tid[t], "tid": t, "args": {"step": s}}
                      for i, (t, s) in enumerate(zip(st["tid"].tolist(), st["step"].tolist()))])
    prefixes = _op_prefixes(tl)
    for lo in range(0, tl.n_ops, CHUNK):
        yield _op_parts(tl, prefixes, lo, min(lo + CHUNK, tl.n_ops))
    n_mem = len(tl.memory["t"])
    for lo in range(0, n_mem, CHUNK):
        yield _memory_parts(tl, lo, min(lo + CHUNK, n_mem))
    sk = tl.stacks
    if sk:
        ts, dur = _us(sk["start"]), _us(sk["end"] - sk["start"])
        frames, tids = sk["frame"].tolist(), sk["tid"].tolist()
        yield _dicts([{"name": frames[i], "cat": "stack", "ph": "X", "ts": ts[i], "dur": dur[i],
                       "pid": pid_of_tid[tids[i]], "tid": tids[i]} for i in range(len(tids))])


def other_data(tl: Timeline) -> dict:
    r = tl.run
    return {"opscope": 1, "run_id": r["run_id"], "model": r.get("model"), "backend": r.get("backend"),
            "device": r.get("device"), "engine": r.get("engine"), "steps": r.get("steps"),
            "t0_ns": tl.t0, "versions": r.get("versions")}


def write_chrome(store, run_id: str, path, gzip: bool = False) -> dict:
    """Write the run as Chrome trace JSON (gzipped when asked). Returns counts for the report. An imported
    torch.profiler trace is written as torch.profiler writes it (kineto.py): its names, annotations, flows, stacks
    and counters as it had them, and a re-import reads it back to the same run."""
    from .kineto import is_kineto_import, write_kineto
    if is_kineto_import(store.get_run(run_id)):
        return write_kineto(store, run_id, path, gzip)
    tl = load_timeline(store, run_id)
    n_meta = 2 * (len(tl.processes) + len(tl.tracks))
    with open_output(path, gzip) as f:
        f.write(b'{"traceEvents":[')
        first = True
        for parts in iter_chunks(tl):
            if not parts:
                continue
            if first:                                   # every event comes with a leading comma
                parts[0] = parts[0][1:]
                first = False
            if gzip:
                f.write(b"".join(parts))                # one compress call, not one per part
            else:
                f.writelines(parts)
        f.write(b'],"displayTimeUnit":"ns","otherData":')
        f.write(orjson.dumps(other_data(tl), default=str))
        f.write(b"}")
    n = n_meta + len(tl.steps["tid"]) + tl.n_ops + len(tl.memory["t"]) + (len(tl.stacks["tid"]) if tl.stacks else 0)
    return {"run_id": tl.run["run_id"], "ops": tl.n_ops, "steps": int(len(tl.steps["tid"])), "trace_events": n}


def load_chrome(path) -> dict:
    """Read a Chrome trace written by us (plain or gzipped) -- for tests and round trips."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip_module.decompress(data)
    return json.loads(data)
