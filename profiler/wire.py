"""The event stream's wire format: what a runner may say to its collector, and nothing else.

    key = new_key()                                   # per run; the runner gets it from its parent
    frames = Sealer(key).batch(batch)                 # runner: [header, payload, mac]
    kind, msg = Opener(key).open(frames)              # collector: ("batch", Batch) or (kind, dict); BadMessage

A message is three ZeroMQ frames:
    header   msgpack map {"kind": ..., "i": message number, "dropped": ..., kind's fields}
    payload  for a batch, its events as raw little-endian int64, (n, 5) in EVENT_INTS order; else empty
    mac      HMAC-SHA256(key, len(header) | header | payload): 32 bytes

Nothing that crosses the socket is unpickled (DESIGN.md). The collector checks the MAC before it
parses a byte, then decodes the header with size limits and checks every field against the schema
below: a message from anyone but its own runner, a truncated or oversized one, or one with a field
of the wrong type raises BadMessage, which the collector counts and drops.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

import msgpack
import numpy as np

from .batch import EVENT_INTS, SITE_COLUMNS, SITE_WIDTHS, Batch
from .store import MEMORY_COLUMNS, TENSOR_COLUMNS

KEY_BYTES = 32
MAC_BYTES = 32
MAX_HEADER = 64 << 20             # one header frame (sites, tensor summaries, a run's meta)
MAX_EVENTS = 1 << 22              # events in one batch (the recorders flush every 4096, or once a step on CUDA)
MAX_FRAME = max(MAX_HEADER, MAX_EVENTS * 8 * len(EVENT_INTS))   # ZeroMQ drops a peer that sends more
# NOTE: ZeroMQ's MAXMSGSIZE bounds each part of a message, not the message: 50 parts under the bound pass it.
# So the collector also reads a message part by part, keeping at most these (stream._receive)
PART_BOUNDS = (MAX_HEADER, MAX_EVENTS * 8 * len(EVENT_INTS), MAC_BYTES)     # header, payload, mac
MAX_MESSAGE = sum(PART_BOUNDS)
MAX_STR = 1 << 20                 # one string field (a shapes JSON of an op with many inputs)
MAX_DEPTH = 16                    # nesting of the free-form meta fields (description, placement)
INT64 = (-(1 << 63), (1 << 63) - 1)


class BadMessage(ValueError):
    """A message the collector refuses; `reason` is one of a few fixed phrases (counted per reason)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _mac(key: bytes, header: bytes, payload) -> bytes:
    # the header's length is in the MAC, so bytes cannot move between the two frames unnoticed
    m = hmac.new(key, len(header).to_bytes(8, "little"), hashlib.sha256)
    m.update(header)
    m.update(payload)
    return m.digest()


def _plain(o):
    """msgpack's fallback on the sending side: numpy scalars and sets from descriptions, else text."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)


class Sealer:
    """Runner side: numbers and seals messages."""

    def __init__(self, key: bytes):
        if len(key) != KEY_BYTES:
            raise ValueError(f"the stream key must be {KEY_BYTES} bytes")
        self.key = key
        self.i = 0
        self._pack = msgpack.Packer(default=_plain, use_bin_type=True).pack

    def seal(self, head: dict, payload=b"") -> list:
        self.i += 1
        header = self._pack({**head, "i": self.i})
        return [header, payload, _mac(self.key, header, payload)]

    def batch(self, b: Batch) -> list:
        ev = np.ascontiguousarray(b.events if b.events is not None else np.zeros((0, 5)), "<i8")
        head = {"kind": "batch", "step": b.step, "thread": b.thread, "sites": b.sites, "tensors": b.tensors,
                "memory": b.memory, "dropped": b.dropped, "n": len(ev)}
        return self.seal(head, memoryview(ev).cast("B") if len(ev) else b"")   # no copy of the events

    def control(self, kind: str, **fields) -> list:
        return self.seal({**fields, "kind": kind})


# --- the schema -------------------------------------------------------------------------------
def _int(v, lo=INT64[0]):
    return type(v) is int and lo <= v <= INT64[1]


def _count(v):
    return _int(v, 0)


def _str(v):
    return type(v) is str and len(v) <= MAX_STR


def _counts(v):
    return type(v) is tuple and (not v or set(map(type, v)) == {int} and min(v) >= 0 and max(v) <= INT64[1])


def _opt_str(v):
    return v is None or _str(v)


# the type of every row column; NOTE: a column added to SITE_COLUMNS or the store's row lists must be
# added here too (an unknown name fails at import, not as every batch refused at run time)
COLUMN_TYPES = {
    **dict.fromkeys(["site", "depth", "bytes", "flops", "alloc_bytes", "free_bytes", "step", "seq", "t_ns",
                     "live_bytes", "count", "nan", "inf"], {int}),
    **dict.fromkeys(["op", "node", "module", "source", "backend", "device", "input_shapes", "input_dtypes",
                     "output_shapes", "output_dtypes", "slot", "shape", "dtype", "hist", "phase", "fwd_node", "parent", "clock"], {str}),
    **dict.fromkeys(["min", "max", "mean", "std", "hist_lo", "hist_hi"], {float, int, type(None)}),
    "fallback": {bool},
}


class RowSchema:
    """The types of one kind of row (sites, tensor summaries, memory samples), checked column by column.

    Each check is a C-level pass (set(map(type, column)), max(column)), so thousands of rows cost
    about what decoding them does. Integers get the int64 bound (msgpack decodes up to uint64);
    strings are already bounded by the decoder's max_str_len.
    """

    def __init__(self, columns: list[str], widths: tuple = ()):
        self.widths = set(widths or (len(columns),))      # a row may stop before columns added later
        self.kinds = [COLUMN_TYPES[c] for c in columns]

    def check(self, rows) -> bool:
        if type(rows) is not tuple:
            return False
        if not rows:
            return True
        lens = set(map(len, rows))
        if set(map(type, rows)) != {tuple} or not lens <= self.widths:
            return False
        groups = [rows] if len(lens) == 1 else [tuple(r for r in rows if len(r) == w) for w in lens]
        for group in groups:
            for col, kinds in zip(zip(*group), self.kinds):
                if not set(map(type, col)) <= kinds or (kinds == {int} and max(col) > INT64[1]):
                    return False
        return True


ROWS = {"sites": RowSchema(SITE_COLUMNS, SITE_WIDTHS), "tensors": RowSchema(TENSOR_COLUMNS),
        "memory": RowSchema(MEMORY_COLUMNS)}


def _rows(name: str, v) -> list[tuple]:
    if not ROWS[name].check(v):
        raise BadMessage("bad rows", name)
    return list(v)


def _json_like(v, depth=0) -> bool:
    """What meta may hold (descriptions, placement reports): plain data, bounded depth."""
    if depth > MAX_DEPTH:
        return False
    if v is None or type(v) in (bool, int, str):
        return type(v) is not int or _int(v)
    if type(v) is float:
        return True
    if type(v) is tuple:           # msgpack arrays decode as tuples (use_list=False: cheaper)
        return all(_json_like(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _json_like(x, depth + 1) for k, x in v.items())
    return False


def _one_of(*values):
    return lambda v: any(v is x or (type(v) is type(x) and v == x) for x in values)


# every field each kind of message carries: name -> check (all required, nothing else allowed)
COMMON = {"kind": _str, "i": _count, "dropped": _count}
SCHEMA = {
    "batch": {"step": _count, "thread": _int, "n": lambda v: _count(v) and v <= MAX_EVENTS,
              "sites": None, "tensors": None, "memory": None},        # rows: checked by _rows
    "hello": {"pid": _count, "t_ns": _int},
    "meta": {"backend": _str, "device": _str, "nodes": lambda v: v is None or _count(v),
             "description": lambda v: type(v) is dict and _json_like(v),
             "placement": lambda v: v is None or _json_like(v)},
    "train": {"info": lambda v: type(v) is dict and _json_like(v)},      # a training run: phases, memory, steps
    "end": {"status": _one_of("ok", "failed"), "error": _opt_str, "error_kind": _one_of(None, "usage", "model"),
            "events": _count, "sent_by_step": _counts},
}


def _header(data: bytes) -> dict:
    try:
        head = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True,
                               max_str_len=MAX_STR, max_bin_len=0, max_ext_len=0, max_array_len=MAX_HEADER,
                               max_map_len=1 << 16)
    except ValueError as e:        # msgpack's format, depth and size errors, bad UTF-8 (the MAC held: our runner's bug)
        raise BadMessage("undecodable header", type(e).__name__)
    if type(head) is not dict:
        raise BadMessage("header is not a map")
    fields = SCHEMA.get(head.get("kind")) if type(head.get("kind")) is str else None
    if fields is None:
        raise BadMessage("unknown kind")
    want = COMMON.keys() | fields.keys()
    if head.keys() != want:
        raise BadMessage("wrong fields", ", ".join(sorted(map(str, head.keys() ^ want))))
    for name, ok in (*COMMON.items(), *fields.items()):
        if ok is not None and not ok(head[name]):
            raise BadMessage("bad field", name)
    return head


class Opener:
    """Collector side: authenticates, decodes and validates; raises BadMessage for anything else."""

    def __init__(self, key: bytes):
        self.key = key
        self.last_i = 0

    def open(self, frames: list) -> tuple[str, object]:
        if len(frames) != len(PART_BOUNDS):
            raise BadMessage("wrong number of frames")
        header, payload, mac = frames
        if any(len(f) > most for f, most in zip(frames, PART_BOUNDS)) or len(mac) != MAC_BYTES:
            raise BadMessage("bad frame size")
        if not hmac.compare_digest(mac, _mac(self.key, header, payload)):
            raise BadMessage("bad MAC")
        head = _header(header)
        if head["i"] <= self.last_i:     # a replayed or reordered message
            raise BadMessage("out of order")
        if head["kind"] == "batch":
            if len(payload) != head["n"] * 8 * len(EVENT_INTS):
                raise BadMessage("payload size does not match n")
            sites, tensors, memory = (_rows(k, head[k]) for k in ("sites", "tensors", "memory"))
            ev = np.frombuffer(payload, dtype="<i8").reshape(-1, len(EVENT_INTS)) if head["n"] else None
            msg = Batch(head["step"], head["thread"], sites, ev, tensors, memory, head["dropped"])
        else:
            if payload:
                raise BadMessage("control message with a payload")
            msg = {k: v for k, v in head.items() if k != "i"}
        self.last_i = head["i"]
        return head["kind"], msg
