"""Perfetto's protobuf trace format, written by hand: for runs too large for JSON viewers.

The `perfetto` Python package fetches a binary at run time, so this writes the wire format itself,
for the small subset of perfetto/trace/*.proto a timeline needs (field numbers from those files):

    Trace           { repeated TracePacket packet = 1 }
    TracePacket     { uint64 timestamp = 8; uint32 trusted_packet_sequence_id = 10;
                      TrackEvent track_event = 11; InternedData interned_data = 12;
                      uint32 sequence_flags = 13; TrackDescriptor track_descriptor = 60 }
    TrackDescriptor { uint64 uuid = 1; string name = 2; ProcessDescriptor process = 3;
                      ThreadDescriptor thread = 4; uint64 parent_uuid = 5; CounterDescriptor counter = 8 }
    ProcessDescriptor { int32 pid = 1; string process_name = 6 }
    ThreadDescriptor  { int32 pid = 1; int64 tid = 2; string thread_name = 5 }
    TrackEvent      { repeated DebugAnnotation debug_annotations = 4; Type type = 9; uint64 name_iid = 10;
                      uint64 track_uuid = 11; repeated string categories = 22; string name = 23;
                      int64 counter_value = 30 }     Type: SLICE_BEGIN = 1, SLICE_END = 2, COUNTER = 4
    DebugAnnotation { uint64 name_iid = 1; int64 int_value = 4; string string_value = 6; string name = 10 }
    InternedData    { repeated EventName event_names = 2; repeated DebugAnnotationName debug_annotation_names = 3 }
    EventName / DebugAnnotationName { uint64 iid = 1; string name = 2 }

Op names and annotation names are interned (one packet declares them, every event refers to an id),
which keeps a million-op trace small. Slices on a track are written begin/end in nesting order,
and the whole stream is sorted by timestamp, as trace processor expects of a file.
"""
from __future__ import annotations

import gzip as gzip_module

import numpy as np

from .timeline import load_timeline

SEQ = 1                                    # our one trusted_packet_sequence_id
SLICE_BEGIN, SLICE_END, COUNTER = 1, 2, 4
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
_ANNOTATIONS = ["node", "module", "source", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes",
                "flops", "bytes", "fallback", "step"]
_INT_ANNOTATIONS = {"flops", "bytes", "step"}


# --- wire format ---------------------------------------------------------------------------------
_SMALL = [bytes([i]) for i in range(128)]


def varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n &= (1 << 64) - 1                 # int64 negatives: ten-byte two's complement, as protobuf does
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_varint(num: int, value: int) -> bytes:
    return varint(num << 3) + varint(int(value))


def field_bytes(num: int, payload: bytes) -> bytes:
    return varint((num << 3) | 2) + varint(len(payload)) + payload


def field_str(num: int, s: str) -> bytes:
    return field_bytes(num, s.encode("utf-8", "replace"))


def _packet(body: bytes) -> bytes:
    return field_bytes(1, body)            # Trace.packet


# --- messages ------------------------------------------------------------------------------------
def _process_track(uuid: int, pid: int, name: str) -> bytes:
    proc = field_varint(1, pid) + field_str(6, name)
    desc = field_varint(1, uuid) + field_str(2, name) + field_bytes(3, proc)
    return _packet(field_bytes(60, desc) + field_varint(10, SEQ))


def _thread_track(uuid: int, parent: int, pid: int, tid: int, name: str) -> bytes:
    th = field_varint(1, pid) + field_varint(2, tid) + field_str(5, name)
    desc = field_varint(1, uuid) + field_varint(5, parent) + field_str(2, name) + field_bytes(4, th)
    return _packet(field_bytes(60, desc) + field_varint(10, SEQ))


def _counter_track(uuid: int, parent: int, name: str) -> bytes:
    desc = field_varint(1, uuid) + field_varint(5, parent) + field_str(2, name) + field_bytes(8, b"")
    return _packet(field_bytes(60, desc) + field_varint(10, SEQ))


def _interned(names: list[str], annotation_names: list[str]) -> bytes:
    data = b"".join(field_bytes(2, field_varint(1, i + 1) + field_str(2, s)) for i, s in enumerate(names))
    data += b"".join(field_bytes(3, field_varint(1, i + 1) + field_str(2, s)) for i, s in enumerate(annotation_names))
    return _packet(field_varint(10, SEQ) + field_varint(13, SEQ_INCREMENTAL_STATE_CLEARED) + field_bytes(12, data))


def _annotation(name_iid: int, value) -> bytes:
    if isinstance(value, (bool, np.bool_)):
        v = field_varint(4, int(value))
    elif isinstance(value, int):
        v = field_varint(4, value)
    else:
        v = field_str(6, str(value))
    return field_bytes(4, field_varint(1, name_iid) + v)


# --- the writer ----------------------------------------------------------------------------------
def write_perfetto(store, run_id: str, path, gzip: bool = False) -> dict:
    tl = load_timeline(store, run_id)
    ops = tl.ops
    names = sorted({str(x) for x in ops["op"].tolist()} | {"step"} |
                   ({str(f) for f in tl.stacks["frame"].tolist()} if tl.stacks else set()))
    name_iid = {s: i + 1 for i, s in enumerate(names)}
    ann_iid = {s: i + 1 for i, s in enumerate(_ANNOTATIONS)}
    tail = field_varint(10, SEQ) + field_varint(13, SEQ_NEEDS_INCREMENTAL_STATE)

    head = [_interned(names, _ANNOTATIONS)]
    proc_uuid = {pid: 1_000_000 + pid for pid in tl.processes}
    for pid, pname in tl.processes.items():
        head.append(_process_track(proc_uuid[pid], pid, pname))
    for t in tl.tracks:
        head.append(_thread_track(t.tid, proc_uuid[t.pid], t.pid, t.tid, t.thread))
    counter_uuid = {pid: 2_000_000 + pid for pid in set(tl.memory["pid"].tolist())}
    for pid, uuid in counter_uuid.items():
        head.append(_counter_track(uuid, proc_uuid[pid], "live memory"))

    # every span as (track, start, end, depth, begin-payload); ops, steps (depth -1) and stacks
    track = [ops["tid"], tl.steps["tid"]]
    start = [ops["start"], tl.steps["start"]]
    end = [ops["end"], tl.steps["end"]]
    depth = [ops["depth"], np.full(len(tl.steps["tid"]), -1)]
    payload_of = [_op_payloads(tl, name_iid, ann_iid),
                  [field_varint(10, name_iid["step"]) + _annotation(ann_iid["step"], s)
                   for s in tl.steps["step"].tolist()]]
    if tl.stacks:
        track.append(tl.stacks["tid"]); start.append(tl.stacks["start"]); end.append(tl.stacks["end"])
        depth.append(tl.stacks["depth"])
        payload_of.append([field_varint(10, name_iid[str(f)]) for f in tl.stacks["frame"].tolist()])
    track, start, end, depth = (np.concatenate(a).astype(np.int64) for a in (track, start, end, depth))
    payloads = [p for group in payload_of for p in group]

    # nesting order per track: by start, parents first; then close each span before its next sibling
    order = np.lexsort((depth, start, track)).tolist()
    tr, st, en, dp = track.tolist(), start.tolist(), end.tolist(), depth.tolist()
    stream_ts: list[int] = []
    stream: list[bytes] = []
    uuid_field = {}
    stack: list[int] = []
    cur_track = None
    for i in order:
        if tr[i] != cur_track:
            while stack:
                j = stack.pop()
                stream_ts.append(en[j]); stream.append(_end(uuid_field, tr[j]))
            cur_track = tr[i]
        while stack and (dp[stack[-1]] >= dp[i] or en[stack[-1]] <= st[i] and en[stack[-1]] < en[i]):
            j = stack.pop()
            stream_ts.append(en[j]); stream.append(_end(uuid_field, tr[j]))
        stream_ts.append(st[i])
        stream.append(field_varint(9, SLICE_BEGIN) + _track(uuid_field, tr[i]) + payloads[i])
        stack.append(i)
    while stack:
        j = stack.pop()
        stream_ts.append(en[j]); stream.append(_end(uuid_field, tr[j]))
    mem = tl.memory
    for p, t, b in zip(mem["pid"].tolist(), mem["t"].tolist(), mem["live_bytes"].tolist()):
        stream_ts.append(t)
        stream.append(field_varint(9, COUNTER) + field_varint(11, counter_uuid[p]) + field_varint(30, b))

    # perfetto wants non-negative timestamps; the stable sort keeps each track's begin/end order
    ts = np.asarray(stream_ts, dtype=np.int64)
    base = 1_000_000 - int(ts.min()) if len(ts) else 0
    n_events = len(stream)
    opener = gzip_module.open if gzip else open
    with opener(path, "wb") as f:
        f.write(b"".join(head))
        by_time = np.argsort(ts, kind="stable").tolist()
        ts_list = (ts + base).tolist()
        buf = []
        for k in by_time:
            ev = stream[k]
            buf.append(_packet(field_varint(8, ts_list[k]) + field_bytes(11, ev) + tail))
            if len(buf) >= 50_000:
                f.write(b"".join(buf)); buf = []
        f.write(b"".join(buf))
    return {"run_id": tl.run["run_id"], "ops": tl.n_ops, "steps": int(len(tl.steps["tid"])),
            "packets": len(head) + n_events}


def _track(cache: dict, tid: int) -> bytes:
    b = cache.get(tid)
    if b is None:
        b = cache[tid] = field_varint(11, tid)
    return b


def _end(cache: dict, tid: int) -> bytes:
    return field_varint(9, SLICE_END) + _track(cache, tid)


def _op_payloads(tl, name_iid, ann_iid) -> list[bytes]:
    """name_iid + debug annotations of each op's SLICE_BEGIN."""
    ops = tl.ops
    cols = {}
    for c in _ANNOTATIONS:
        col = ops[c]
        if col.dtype.kind == "f":
            cols[c] = [None if v != v else int(v) for v in col.tolist()]
        else:
            cols[c] = col.tolist()
    opname = ops["op"].tolist()
    out = []
    for i in range(len(opname)):
        parts = [field_varint(10, name_iid[str(opname[i])])]
        for c in _ANNOTATIONS:
            v = cols[c][i]
            if v is None or v == "" or (c == "fallback" and not v):
                continue
            parts.append(_annotation(ann_iid[c], v))
        out.append(b"".join(parts))
    return out
