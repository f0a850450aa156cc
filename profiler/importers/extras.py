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
_INT64 = range(-2 ** 63, 2 ** 63)     # what orjson (and the store's BIGINT columns) can hold


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
            if (m := _as_dict(events[i])) is not None:
                meta.append(m)
            continue
        if not ((p == "X" and c == "cpu_op") or (n == "[memory]" and p in ("i", "I"))):
            continue
        ev = events[i]
        ts, tid, pid = ev.get("ts"), ev.get("tid"), ev.get("pid")
        if not isinstance(n, str) or type(ts) not in (int, float) or not _small(tid) or (ts_ns := _ns(ts)) is None:
            continue              # a time or thread the importer reads some other way: written as the store has it
        pid = pid if _small(pid) else None
        if pid is not None:
            pids.setdefault(tid, pid)
        if (text := _args_text(ev)) is False:
            continue              # args orjson cannot write (an int past 64 bits): exported as the store has it
        args.append([n, tid, ts_ns, pid, text])
    for tid, pid in zip(column(events, "tid"), column(events, "pid")):      # threads with frames only, too
        if _small(tid) and _small(pid):
            pids.setdefault(tid, pid)
    # the stacks table keeps "f (x.py:12)": the name as written, for each such text (one name each, nearly always)
    written: dict = defaultdict(list)
    for n in frames:
        if isinstance(n, str):
            written[_frame_info(n)[1]].append(n)
    return {"version": _VERSION, "meta": meta, "args": args, "pids": sorted(pids.items()),
            "frames": {short: names[0] for short, names in written.items() if len(names) == 1}}


def _small(x) -> bool:
    """An int the artifact can hold: a trace may write ids past int64, which the store reads its own way."""
    return type(x) is int and x in _INT64


def _ns(ts) -> int | None:
    try:
        ns = round(ts * 1000)
    except (OverflowError, ValueError):       # inf, nan
        return None
    return ns if ns in _INT64 else None


def _as_dict(ev) -> dict | None:
    if not is_record(ev):
        return ev if _dumps(ev) is not None else None
    # a typed record reads an absent field as its default: a metadata event has no category and no duration
    out = {k: v for k in ev.keys() if (v := ev.get(k)) is not None and not (k == "dur" and v == 0)}
    if "args" in out:
        out["args"] = ev.args
    return out if _dumps(out) is not None else None


def _args_text(ev) -> str | None | bool:
    raw = getattr(ev, "raw_args", None)
    if raw is not None:
        return bytes(raw).decode() if raw else None
    a = ev.get("args")
    if a is None:
        return None
    text = _dumps(a)
    return text.decode() if text is not None else False


def _dumps(x) -> bytes | None:
    """orjson's text, or None for what it cannot write (an int past 64 bits): left out of the extras, that
    event exports as the store has it."""
    try:
        return orjson.dumps(x)
    except TypeError:
        return None


def keep(store, run_id: str, extras: dict) -> None:
    text = _dumps(extras)
    if text is not None:          # collect() leaves out what orjson cannot write; were anything left, no extras
        store.add_artifact(run_id, KIND, f"v{_VERSION}", zlib.compress(text, 1))


class Extras:
    """A run's kept extras, read back for the exporter and the memory page's lifetimes. The artifact is read as
    hostile (a store is a file anyone with the folder can edit): its decompressed size bounded by the import's
    own limit (what the importer kept is a part of a trace it read), every row checked for the types collect()
    writes; what is not is left out, and that event is exported as the tables have it."""

    def __init__(self, doc: dict):
        meta, pids, frames = doc.get("meta"), doc.get("pids"), doc.get("frames")
        self.meta = [m for m in meta if isinstance(m, dict)] if isinstance(meta, list) else []
        self._pids = {t: p for t, p in _pairs(pids) if type(t) is int and type(p) is int}
        self.frames = ({k: v for k, v in frames.items() if isinstance(v, str)} if isinstance(frames, dict) else {})
        self._args: dict = defaultdict(list)
        self._memory: list = []           # (ts ns, args JSON text) of each [memory] event, in trace order
        for row in doc.get("args") if isinstance(doc.get("args"), list) else []:
            if not (isinstance(row, list) and len(row) == 5):
                continue
            n, tid, ts, pid, text = row
            if (isinstance(n, str) and type(tid) in (int, type(None)) and type(ts) is int
                    and type(pid) in (int, type(None)) and isinstance(text, (str, type(None)))):
                self._args[(n, ts)].append((tid, pid, text))
                if n == "[memory]" and text:
                    self._memory.append((ts, text))

    @classmethod
    def load(cls, store, run_id: str) -> "Extras | None":
        """The kept extras, or None: none kept (a run imported before they were), or what is kept is not them."""
        from .common import max_bytes
        for _kind, name, blob in store.artifacts(run_id, KIND):
            if name != f"v{_VERSION}":
                continue
            try:
                unzip = zlib.decompressobj()
                text = unzip.decompress(blob, max_bytes() + 1)
                if len(text) > max_bytes() or not unzip.eof:
                    return None
                doc = orjson.loads(text)
            except (zlib.error, orjson.JSONDecodeError):
                return None
            return cls(doc) if isinstance(doc, dict) else None
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
        if not text:
            return tid, pid, None
        args = _object(text)
        return (tid, pid, args) if args is not None else None

    def memory(self) -> list[tuple[int, dict]]:
        """(ts ns, args) of each [memory] event, in trace order (Addr, Bytes, Device Type, Device Id)."""
        return [(ts, a) for ts, text in self._memory if (a := _object(text)) is not None]


def _pairs(x) -> list:
    return [p for p in x if isinstance(p, list) and len(p) == 2] if isinstance(x, list) else []


def _object(text: str) -> dict | None:
    try:
        a = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return a if isinstance(a, dict) else None
