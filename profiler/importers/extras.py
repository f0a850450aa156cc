"""What a torch.profiler trace holds that the store's tables have no column for, kept beside the run so that
`opscope trace export` writes the trace back as it came (issue 38: an export lost every process and thread name,
the pids, Python frames' paths, memory events' Addr and Total Reserved, and ops' strides, concrete inputs,
External id and Sequence number).

    x = collect(events)                # while importing: the trace's events, typed (typed.py) or dicts
    keep(store, run_id, x)             # after the run is saved: one artifact, compressed
    x = Extras.load(store, run_id)     # the exporter: x.args("aten::mm", tid, ts_ns), x.pid(tid), x.frame(...)

Kept: the metadata events (`ph: M`: process and thread names, labels, sort indexes) as they are; each cpu_op's
and `[memory]` event's args as the trace wrote them (its JSON text), found again by name, thread and start (ns,
as the importer reads `ts`); each host thread's pid; each Python frame's name as written ("path/x.py(12): f"),
from the stacks table's "f (x.py:12)". Like Perfetto's args table, it is data the views do not read.
"""
from __future__ import annotations

import zlib
from collections import defaultdict

import orjson

from .details import _frame_info
from .typed import column, is_record

KIND = "trace-extras"         # the artifacts kind
_VERSION = 1


def collect(events) -> dict:
    """The extras of a trace's events (list of dicts or typed records)."""
    ph, cat, name = column(events, "ph"), column(events, "cat"), column(events, "name")
    args: list = []               # [name, tid, ts_ns, pid, args JSON text]
    meta: list = []
    pids: dict = {}
    frames: set = set()
    for i, (p, c, n) in enumerate(zip(ph, cat, name)):
        if p == "X" and c == "python_function":
            frames.add(n)
            continue
        if p == "M":
            meta.append(_as_dict(events[i]))
            continue
        if not ((p == "X" and c == "cpu_op") or (n == "[memory]" and p in ("i", "I"))):
            continue
        ev = events[i]
        ts, tid, pid = ev.get("ts"), ev.get("tid"), ev.get("pid")
        if type(ts) not in (int, float) or type(tid) is not int:
            continue              # a time or thread the importer reads some other way: written as the store has it
        if type(pid) is int:
            pids.setdefault(tid, pid)
        args.append([n, tid, round(ts * 1000), pid, _args_text(ev)])
    for tid, pid in zip(column(events, "tid"), column(events, "pid")):      # threads with frames only, too
        if type(tid) is int and type(pid) is int:
            pids.setdefault(tid, pid)
    # the stacks table keeps "f (x.py:12)": the name as written, for each such text (one name each, nearly always)
    written: dict = defaultdict(list)
    for n in frames:
        if isinstance(n, str):
            written[_frame_info(n)[1]].append(n)
    return {"version": _VERSION, "meta": meta, "args": args, "pids": sorted(pids.items()),
            "frames": {short: names[0] for short, names in written.items() if len(names) == 1}}


def _as_dict(ev) -> dict:
    if not is_record(ev):
        return ev
    # a typed record reads an absent field as its default: a metadata event has no category and no duration
    out = {k: v for k in ev.keys() if (v := ev.get(k)) is not None and not (k == "dur" and v == 0)}
    if "args" in out:
        out["args"] = ev.args
    return out


def _args_text(ev) -> str | None:
    raw = getattr(ev, "raw_args", None)
    if raw is not None:
        return bytes(raw).decode() if raw else None
    a = ev.get("args")
    return orjson.dumps(a).decode() if a is not None else None


def keep(store, run_id: str, extras: dict) -> None:
    store.add_artifact(run_id, KIND, f"v{_VERSION}", zlib.compress(orjson.dumps(extras), 1))


class Extras:
    """A run's kept extras, read back for the exporter."""

    def __init__(self, doc: dict):
        self.meta = doc.get("meta") or []
        self._pids = {int(t): p for t, p in doc.get("pids") or []}
        self.frames = doc.get("frames") or {}
        self._args: dict = defaultdict(list)
        for n, tid, ts, pid, text in doc.get("args") or []:
            self._args[(n, ts)].append((tid, pid, text))

    @classmethod
    def load(cls, store, run_id: str) -> "Extras | None":
        for _kind, name, blob in store.artifacts(run_id, KIND):
            if name == f"v{_VERSION}":
                return cls(orjson.loads(zlib.decompress(blob)))
        return None

    def pid(self, tid, default: int) -> int:
        return self._pids.get(int(tid or 0), default)

    def take(self, name: str, ts_ns: int, tid=None) -> tuple | None:
        """(tid, pid, args) of the event written with this name and start (on this thread, when two share them);
        each is given once."""
        got = self._args.get((name, int(ts_ns)))
        if not got:
            return None
        k = next((i for i, g in enumerate(got) if g[0] == tid), 0)
        tid, pid, text = got.pop(k)
        return tid, pid, orjson.loads(text) if text else None
