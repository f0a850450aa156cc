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
    DebugAnnotation { uint64 name_iid = 1; int64 int_value = 4; string string_value = 6; string name = 10;
                      uint64 string_value_iid = 17 }
    InternedData    { repeated EventName event_names = 2; repeated DebugAnnotationName debug_annotation_names = 3;
                      repeated InternedString debug_annotation_string_values = 29 }
    EventName / DebugAnnotationName { uint64 iid = 1; string name = 2 }     InternedString { uint64 iid = 1; bytes str = 2 }

Op names, annotation names and annotation text (nodes, modules, shapes) are interned: one packet
declares them, every event refers to an id, which keeps a million-op trace small. Slices on a track are written begin/end in nesting order,
and the whole stream is sorted by timestamp, as trace processor expects of a file.

Speed: a million ops are two million packets, so they are not built one by one. Every packet is
its "static" TrackEvent bytes (type, track, name, interned text annotations: one per op kind, one
per track for ends) plus a few varints (timestamp, step, FLOPs, bytes, lengths), all encoded by
numpy for a whole chunk at once and packed with one mask gather (rows.py). Where each begin and end goes in
the stream follows from the nesting itself: pre-order index, nesting level and subtree size.
"""
from __future__ import annotations

import numpy as np

from . import open_output
from .rows import const_block, packed, table_block, varint_block
from .timeline import load_timeline

SEQ = 1                                    # our one trusted_packet_sequence_id
SLICE_BEGIN, SLICE_END, COUNTER = 1, 2, 4
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
_ANNOTATIONS = ["node", "module", "source", "input_shapes", "input_dtypes", "output_shapes", "output_dtypes",
                "flops", "bytes", "fallback", "step", "phase", "fwd_node"]
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


def _interned(names: list[str], annotation_names: list[str], strings: list[str] = ()) -> bytes:
    data = b"".join(field_bytes(2, field_varint(1, i + 1) + field_str(2, s)) for i, s in enumerate(names))
    data += b"".join(field_bytes(3, field_varint(1, i + 1) + field_str(2, s)) for i, s in enumerate(annotation_names))
    data += b"".join(field_bytes(29, field_varint(1, i + 1) + field_str(2, s)) for i, s in enumerate(strings))
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
CHUNK = 200_000
_TAIL = field_varint(10, SEQ) + field_varint(13, SEQ_NEEDS_INCREMENTAL_STATE)
_DYNAMIC = ["flops", "bytes", "step"]                  # annotations whose value changes from op to op


def write_perfetto(store, run_id: str, path, gzip: bool = False) -> dict:
    tl = load_timeline(store, run_id)
    ops, st, sk = tl.ops, tl.steps, tl.stacks
    frames = [str(f) for f in sk["frame"].tolist()] if sk else []
    names = sorted({k["name"] for k in tl.kinds} | {"step"} | set(frames))
    name_iid = {s: i + 1 for i, s in enumerate(names)}
    ann_iid = {s: i + 1 for i, s in enumerate(_ANNOTATIONS)}

    strings = sorted({str(k[c]) for k in tl.kinds for c in _ANNOTATIONS
                      if c not in _DYNAMIC and c != "fallback" and k.get(c) not in (None, "")})
    str_iid = {s: i + 1 for i, s in enumerate(strings)}
    head = [_interned(names, _ANNOTATIONS, strings)]
    proc_uuid = {pid: 1_000_000 + pid for pid in tl.processes}
    for pid, pname in tl.processes.items():
        head.append(_process_track(proc_uuid[pid], pid, pname))
    for t in tl.tracks:
        head.append(_thread_track(t.tid, proc_uuid[t.pid], t.pid, t.tid, t.thread))
    counter_uuid = {pid: 2_000_000 + pid for pid in sorted(set(tl.memory["pid"].tolist()))}
    for pid, uuid in counter_uuid.items():
        head.append(_counter_track(uuid, proc_uuid[pid], "live memory"))

    # the static TrackEvent bytes every packet starts with: op kinds, step begins and ends per track,
    # stack frames per track, counters per counter track
    static: list[bytes] = []

    def add(items):
        base = len(static)
        static.extend(items)
        return base

    # each op's TrackEvent.categories holds its phase (forward / backward / optimizer), as Chrome's cat does
    op_base = add([_begin(k["tid"], name_iid[k["name"]]) + field_str(22, k["phase"] or "forward") +
                   _static_annotations(k, ann_iid, str_iid) for k in tl.kinds])
    tids = [t.tid for t in tl.tracks]
    tid_index = np.zeros(max(tids, default=0) + 1, dtype=np.int64)
    tid_index[tids] = np.arange(len(tids))
    step_base = add([_begin(t, name_iid["step"]) for t in tids])
    end_base = add([field_varint(9, SLICE_END) + field_varint(11, t) for t in tids])
    counter_pids = list(counter_uuid)
    counter_base = add([field_varint(9, COUNTER) + field_varint(11, counter_uuid[p]) for p in counter_pids])
    stack_static = np.zeros(0, np.int64)
    if sk:
        pairs: dict = {}
        stack_static = np.asarray([pairs.setdefault((t, f), len(pairs)) for t, f in zip(sk["tid"].tolist(), frames)],
                                  dtype=np.int64)
        stack_static += add([_begin(t, name_iid[f]) for (t, f) in pairs])

    # every span's begin and end position in nesting (DFS) order, from pre-order index, level and size
    n, g = tl.n_ops, len(st["tid"])
    group = np.repeat(np.arange(g), st["count"])
    pre = [np.arange(n) + group + 1, st["first"] + np.arange(g)]
    level = [ops["level"] + 1, np.zeros(g, np.int64)]
    size = [ops["size"], st["count"] + 1]
    span_start, span_end = [ops["start"], st["start"]], [ops["end"], st["end"]]
    span_tid = [ops["tid"], st["tid"]]
    begin_static = [op_base + ops["kind"], step_base + tid_index[st["tid"]]]
    if sk:
        m = len(sk["tid"])
        pre.append(n + g + np.arange(m)); level.append(sk["level"]); size.append(sk["size"])
        span_start.append(sk["start"]); span_end.append(sk["end"]); span_tid.append(sk["tid"])
        begin_static.append(stack_static)
    pre, level, size, span_start, span_end, span_tid, begin_static = (
        np.concatenate(a).astype(np.int64) for a in (pre, level, size, span_start, span_end, span_tid, begin_static))
    begin_pos = 2 * pre - level
    end_pos = begin_pos + 2 * size - 1
    n_spans = len(pre)
    n_mem = len(tl.memory["t"])
    rows = 2 * n_spans + n_mem
    ts = np.empty(rows, np.int64)
    sidx = np.empty(rows, np.int64)
    ts[begin_pos], ts[end_pos] = span_start, span_end
    sidx[begin_pos], sidx[end_pos] = begin_static, end_base + tid_index[span_tid]
    ts[2 * n_spans:] = tl.memory["t"]
    pid_pos = {p: i for i, p in enumerate(counter_pids)}
    sidx[2 * n_spans:] = counter_base + np.asarray([pid_pos[p] for p in tl.memory["pid"].tolist()], dtype=np.int64)

    # the changing values: annotations of op and step begins, counter values
    dyn = {}
    for c in _DYNAMIC:
        val, has = np.zeros(rows, np.int64), np.zeros(rows, bool)
        if c == "step":
            val[begin_pos[:n + g]] = np.concatenate([ops["step"], st["step"]])
            has[begin_pos[:n + g]] = True
        else:
            val[begin_pos[:n]] = ops[c]
            has[begin_pos[:n]] = ~tl.nulls[c] if c in tl.nulls else True
        dyn[c] = (val, has)
    counter_val, counter_has = np.zeros(rows, np.int64), np.zeros(rows, bool)
    counter_val[2 * n_spans:] = tl.memory["live_bytes"]
    counter_has[2 * n_spans:] = True

    # perfetto wants non-negative timestamps; the stable sort keeps each track's begin/end order
    if rows and np.any(np.diff(ts) < 0):
        order = np.argsort(ts, kind="stable")
        ts, sidx, counter_val, counter_has = ts[order], sidx[order], counter_val[order], counter_has[order]
        dyn = {c: (v[order], h[order]) for c, (v, h) in dyn.items()}
    base = 1_000_000 - int(ts.min()) if rows else 0
    ts = ts + base

    static_table = table_block(static)
    with open_output(path, gzip) as f:
        f.write(b"".join(head))
        for lo in range(0, rows, CHUNK):
            sl = slice(lo, min(lo + CHUNK, rows))
            f.write(_packets(ts[sl], (static_table[0][:, sidx[sl]], static_table[1][sidx[sl]]),
                             [(ann_iid[c], v[sl], h[sl]) for c, (v, h) in dyn.items()], counter_val[sl],
                             counter_has[sl]))
    return {"run_id": tl.run["run_id"], "ops": tl.n_ops, "steps": int(g), "packets": len(head) + rows}


def _begin(tid: int, name: int) -> bytes:
    return field_varint(9, SLICE_BEGIN) + field_varint(11, tid) + field_varint(10, name)


def _static_annotations(kind: dict, ann_iid: dict, str_iid: dict) -> bytes:
    """The debug annotations an op kind always carries: its text (interned), fallback when set."""
    out = []
    for c in _ANNOTATIONS:
        if c in _DYNAMIC:
            continue
        v = kind.get(c)
        if v is None or v == "" or (c == "fallback" and not v):
            continue
        if c == "fallback":
            out.append(_annotation(ann_iid[c], v))
        else:
            out.append(field_bytes(4, field_varint(1, ann_iid[c]) + field_varint(17, str_iid[str(v)])))
    return b"".join(out)


def _packets(ts, static, anns, counter_val, counter_has) -> bytes:
    """Trace.packet { timestamp, sequence fields, track_event { static bytes, annotations, counter_value } },
    for a chunk of packets at once."""
    n = len(ts)
    blocks = [static]
    te_len = static[1].copy()
    for iid, val, has in anns:
        vb, vl = varint_block(val)
        vl = vl * has
        # DebugAnnotation { name_iid = 1; int_value = 4 }: 0x22 len 0x08 iid 0x20 varint
        head = np.repeat(np.asarray([0x22, 0, 0x08, iid, 0x20], np.uint8)[:, None], n, axis=1)
        head[1] = 3 + vl
        blocks += [(head, 5 * has), (vb, vl)]
        te_len += (5 * has) + vl
    cb, cl = varint_block(counter_val)
    cl = cl * counter_has
    blocks += [(const_block(b"\xf0\x01", n)[0], 2 * counter_has), (cb, cl)]
    te_len += 2 * counter_has + cl
    tsb, tsl = varint_block(ts)
    teb, tel = varint_block(te_len)
    body_len = 1 + tsl + len(_TAIL) + 1 + tel + te_len
    bb, bl = varint_block(body_len)
    return packed([const_block(b"\x0a", n), (bb, bl), const_block(b"\x40", n), (tsb, tsl), const_block(_TAIL, n),
                   const_block(b"\x5a", n), (teb, tel), *blocks])
