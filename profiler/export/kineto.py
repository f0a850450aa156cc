"""An imported torch.profiler trace written back as torch.profiler writes it (Kineto's Chrome JSON), so an export
keeps what the import read: the trace's op names (`aten::mm`), its record_function annotations and runtime calls
(the spans table), its forward-backward and launch flows (the flows table), every depth of its Python stacks (the
stacks table), its `[memory]` counters (the memory table) and its kernels. Perfetto UI and chrome://tracing open it
like the original; `opscope trace import` reads it back through the same Kineto path, to the same run.

What the store's tables have no column for -- the metadata events (process and thread names), pids, each op's and
memory event's args as written (External id, Sequence number, Input Strides, Concrete Inputs, Addr, Total Reserved)
and Python frames' paths -- the import kept beside the run (importers/extras.py) and is written back from there, so
a trace survives import and export field by field (tests/test_trace_roundtrip.py). A run imported before that
was kept gets what the tables say: pid 0, the ops' dims and types, a frame's path its file's name (the user's own
files their full path from the ops' `source`).
"""
from __future__ import annotations

import json

import orjson

from opscope.profiler.importers.chrome import GPU_OPS
from opscope.profiler.importers.common import DTYPES
from opscope.profiler.importers.extras import Extras

from . import open_output

_KINETO_DTYPE = {}
for _k, _v in DTYPES.items():            # the first Kineto spelling of each dtype ("float" for float32)
    _KINETO_DTYPE.setdefault(_v, _k)
_CAT_OF_OP = {op: cat for cat, op in GPU_OPS.items()}
# a path that the importer reads as not the user's code ("<...>"), for frames of libraries
_LIBRARY = "<library>/"
_DEVICE_TYPE = {"cpu": 0, "cuda": 1, "hip": 6, "xla": 9, "xpu": 12, "mps": 13, "hpu": 15, "mtia": 19}


def is_kineto_import(run: dict) -> bool:
    cfg = run.get("config") or {}
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            return False
    return isinstance(cfg, dict) and run.get("engine") == "import" and cfg.get("format") == "kineto"


def _us(ns) -> float:
    return round(int(ns) / 1000.0, 3)


def _pid(device) -> int:
    d = str(device or "")
    if d.startswith("cpu pid "):
        try:
            return int(d[8:])
        except ValueError:
            return 0
    if ":" in d:
        try:
            return int(d.rsplit(":", 1)[1])
        except ValueError:
            return 0
    return 0


def _frame_name(frame: str, user_paths: dict) -> str:
    """The stacks table's "forward (model.py:12)" -> Kineto's "path/model.py(12): forward"."""
    if not frame.endswith(")") or " (" not in frame or frame.startswith("nn.Module: "):
        return frame
    func, _, where = frame[:-1].rpartition(" (")
    file, _, line = where.rpartition(":")
    if not file or not line.isdigit():
        return frame
    path = user_paths.get((file, line)) or _LIBRARY + file
    return f"{path}({line}): {func}"


def _loads(x):
    if not x:
        return {}
    try:
        v = json.loads(x)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def kineto_events(store, run_id: str) -> list[dict]:
    """The run's events in Kineto's form, in time order."""
    q = store.query
    kept = Extras.load(store, run_id)
    out: list[dict] = [dict(m) for m in kept.meta] if kept else []

    def pid(device, thread) -> int:
        """The trace's pid of a host thread (kept at import); a device's stream by its device index."""
        return kept.pid(thread, _pid(device)) if kept and ":" not in str(device or "") else _pid(device)

    def as_written(ev: dict, ts_ns) -> dict:
        """The event with the pid, thread and args the trace wrote for it, where the import kept them."""
        got = kept.take(ev["name"], ts_ns, ev["tid"]) if kept else None
        if got is not None:
            tid, p, args = got
            ev.update(tid=tid if tid is not None else ev["tid"], pid=p if p is not None else ev["pid"])
            if args is not None:
                ev["args"] = args
            else:
                ev.pop("args", None)
        return ev
    ops = q("""SELECT op, node, device, thread, start_ns, end_ns, input_shapes, input_dtypes, source
               FROM events WHERE run_id = ? ORDER BY start_ns, depth""", [run_id])
    user_paths: dict = {}
    for op, node, device, thread, s, e, shapes, dtypes, source in ops:
        if source and ":" in source:
            path, _, line = source.rpartition(":")
            user_paths[(path.replace("\\", "/").rsplit("/", 1)[-1], line)] = path
        cat = _CAT_OF_OP.get(op)
        ev = {"ph": "X", "cat": cat or "cpu_op", "name": node or op, "pid": pid(device, thread), "tid": int(thread or 0),
              "ts": _us(s), "dur": _us(e - s)}
        if cat:
            ev["args"] = {"device": _pid(device), "stream": int(thread or 0)}
        else:
            dims, types = json.loads(shapes) if shapes else None, json.loads(dtypes) if dtypes else None
            if isinstance(dims, list) and isinstance(types, list):
                ev["args"] = {"Input Dims": dims, "Input type": [_KINETO_DTYPE.get(t, t) for t in types]}
            as_written(ev, s)
        out.append(ev)
    for kind, name, device, thread, s, e, args in q(
            "SELECT kind, name, device, thread, start_ns, end_ns, args FROM spans WHERE run_id = ? ORDER BY start_ns",
            [run_id]):
        out.append({"ph": "X", "cat": kind, "name": name, "pid": pid(device, thread), "tid": int(thread or 0),
                    "ts": _us(s), "dur": _us(e - s), "args": _loads(args)})
    for t, dur, thread, _depth, frame in q(
            "SELECT t_ns, dur_ns, thread, depth, frame FROM stacks WHERE run_id = ? ORDER BY t_ns, depth", [run_id]):
        frame = str(frame or "?")
        out.append({"ph": "X", "cat": "python_function",
                    "name": kept.frames.get(frame) if kept and frame in kept.frames else _frame_name(frame, user_paths),
                    "pid": pid("", thread), "tid": int(thread or 0), "ts": _us(t), "dur": _us(dur)})
    for t, backend, live, alloc, free, thread in q(
            """SELECT m.t_ns, m.backend, m.live_bytes, m.alloc_bytes, m.free_bytes, e.thread FROM memory m
               LEFT JOIN events e ON e.run_id = m.run_id AND e.step = m.step AND e.seq = m.seq
               WHERE m.run_id = ? ORDER BY m.t_ns""", [run_id]):
        kind, _, idx = str(backend or "cpu").removeprefix("torch:").partition(":")
        out.append(as_written({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                               "pid": pid("", thread), "tid": int(thread or 0), "ts": _us(t),
                               "args": {"Total Allocated": int(live or 0), "Bytes": int(alloc or 0) - int(free or 0),
                                        "Device Type": _DEVICE_TYPE.get(kind, 0),
                                        "Device Id": int(idx) if idx.isdigit() else -1}}, t))
    for kind, fid, fdev, fth, fns, tdev, tth, tns in q(
            """SELECT kind, flow_id, from_device, from_thread, from_ns, to_device, to_thread, to_ns FROM flows
               WHERE run_id = ? ORDER BY from_ns""", [run_id]):
        fid = int(fid) if str(fid).isdigit() else fid
        out.append({"ph": "s", "id": fid, "pid": pid(fdev, fth), "tid": int(fth or 0), "ts": _us(fns), "cat": kind,
                    "name": kind})
        out.append({"ph": "f", "id": fid, "pid": pid(tdev, tth), "tid": int(tth or 0), "ts": _us(tns), "cat": kind,
                    "name": kind, "bp": "e"})
    return out


def write_kineto(store, run_id: str, path, gzip: bool = False) -> dict:
    run = store.get_run(run_id)
    events = kineto_events(store, run["run_id"])
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms",
           "exportedBy": {"tool": "opscope", "run_id": run["run_id"], "source": "torch.profiler"}}
    with open_output(path, gzip) as f:
        f.write(orjson.dumps(doc))
    n_ops = sum(1 for e in events if e["ph"] == "X" and e["cat"] in ("cpu_op", *GPU_OPS))
    return {"run_id": run["run_id"], "ops": n_ops, "steps": int(run.get("steps") or 0), "trace_events": len(events)}
