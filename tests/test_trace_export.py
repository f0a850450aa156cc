"""Trace export: Chrome JSON that viewers open, Perfetto protobuf, per-op CSV.

No trace processor runs here (the perfetto package downloads a binary), so the format rules are
checked by `check_chrome` and a small protobuf wire-format decoder, both written from the specs.
"""
import csv
import gzip
import json
from collections import Counter, defaultdict

import pytest

from opscope.profiler.export import export
from opscope.profiler.export.chrome import load_chrome
from opscope.profiler.store import RunStore

T0 = 10 ** 12


# --- a checker of the Chrome Trace Event Format rules ---------------------------------------------
def check_chrome(doc) -> dict:
    """Required keys, types, units, metadata and strict per-thread nesting. Returns X events per cat."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    procs, threads = set(), set()
    spans = defaultdict(list)
    cats = Counter()
    for ev in doc["traceEvents"]:
        assert isinstance(ev, dict) and ev["ph"] in ("X", "M", "C"), ev
        assert isinstance(ev["pid"], int) and 0 < ev["pid"] < 10_000, ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), ev
            assert isinstance(ev["args"], dict)
            if ev["name"] == "process_name":
                assert isinstance(ev["args"]["name"], str) and ev["args"]["name"]
                procs.add(ev["pid"])
            if ev["name"] == "thread_name":
                threads.add((ev["pid"], ev["tid"]))
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        assert abs(ev["ts"] * 1000 - round(ev["ts"] * 1000)) < 1e-3, ev        # microseconds, 3 decimals
        if ev["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
            cats["counter"] += 1
            continue
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["tid"], int) and 0 < ev["tid"] < 10_000, ev
        assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
        cats[ev.get("cat")] += 1
        spans[(ev["pid"], ev["tid"])].append((round(ev["ts"] * 1000), round((ev["ts"] + ev["dur"]) * 1000),
                                              ev.get("cat") != "step"))
    for (pid, tid), ss in spans.items():
        assert pid in procs and (pid, tid) in threads, (pid, tid)
        # strict nesting: sorted by start (longest first), each span ends before the one enclosing it
        ss.sort(key=lambda s: (s[0], -s[1], s[2]))
        stack = []
        for s, e, _ in ss:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], f"span {s}-{e} crosses its parent's end {stack[-1]} on {pid}/{tid}"
            stack.append(e)
    return cats


# --- a protobuf wire-format decoder (enough for Perfetto traces) -----------------------------------
def _varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 128:
            return n, i


def fields(buf):
    """-> list of (field number, value): ints for varints, bytes for length-delimited."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            ln, i = _varint(buf, i)
            v, i = bytes(buf[i:i + ln]), i + ln
            assert i <= len(buf), "length runs past the end"
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError(f"wire type {wt}")
        out.append((num, v))
    return out


def decode_perfetto(data: bytes) -> dict:
    packets = [v for num, v in fields(data) if num == 1]
    assert len(packets) == len(fields(data)), "a Trace holds only packets"
    names, strings, tracks, counter_tracks, events = {}, {}, {}, set(), []
    for pk in packets:
        f = dict(fields(pk))
        assert f.get(10) == 1                                        # trusted_packet_sequence_id
        if 12 in f:
            for num, v in fields(f[12]):
                if num in (2, 29):                                   # event names, annotation string values
                    e = dict(fields(v))
                    (names if num == 2 else strings)[e[1]] = e[2].decode()
        if 60 in f:
            d = dict(fields(f[60]))
            tracks[d[1]] = d
            if 8 in d:
                counter_tracks.add(d[1])
        if 11 in f:
            te = fields(f[11])
            d = dict(te)
            ann = {}
            for num, v in te:
                if num == 4:
                    a = dict(fields(v))
                    ann[a[1]] = a[4] if 4 in a else a[6].decode() if 6 in a else strings[a[17]]
            events.append({"ts": f[8], "type": d[9], "track": d[11], "name": names.get(d.get(10)),
                           "value": d.get(30), "ann": ann, "flags": f.get(13)})
    return {"names": names, "tracks": tracks, "counter_tracks": counter_tracks, "events": events,
            "packets": len(packets)}


def check_perfetto(data: bytes) -> Counter:
    """Begin/end balance and nesting per track, every track declared, names resolved. -> begins per name."""
    t = decode_perfetto(data)
    begins = Counter()
    stacks = defaultdict(list)
    last_ts = -1
    for ev in t["events"]:
        assert ev["ts"] >= last_ts, "packets sorted by timestamp"
        last_ts = ev["ts"]
        assert ev["track"] in t["tracks"], "event on an undeclared track"
        if ev["type"] == 1:
            assert ev["name"] is not None and ev["flags"] == 2
            stacks[ev["track"]].append(ev["name"])
            begins[ev["name"]] += 1
        elif ev["type"] == 2:
            assert stacks[ev["track"]], "SLICE_END without a begin"
            stacks[ev["track"]].pop()
        else:
            assert ev["type"] == 4 and ev["track"] in t["counter_tracks"] and ev["value"] is not None
            begins["<counter>"] += 1
    assert all(not s for s in stacks.values()), "unbalanced slices"
    for uuid, d in t["tracks"].items():
        if 4 in d:     # thread tracks name a parent process track that exists
            assert d[5] in t["tracks"] and 3 in t["tracks"][d[5]]
    return begins


# --- runs to export --------------------------------------------------------------------------------
def _row(step, seq, op, start, end, depth=0, thread=77, backend="sim:npu-a1", device="npu", live=None):
    return (step, seq, op, f"{op}_{seq}", "layers.0.mlp", "model.py:12", backend, device, thread, depth, start, end,
            "[[2,8]]", '["float32"]', "[[2,8]]", '["float32"]', 64, 128, op == "gelu", live)


def make_run(store, rows, memory=(), stacks=()):
    rid = store.create_run(model="test:synthetic", backend="sim:npu-a1", device="npu", steps=2)
    store.add_events(rid, rows)
    if memory:
        store.add_memory(rid, list(memory))
    if stacks:
        store.add_stacks(rid, list(stacks))
    store.finish_run(rid)
    return rid


@pytest.fixture
def store():
    return RunStore()


def test_chrome_export_clamps_overlapping_and_overhanging_spans_into_strict_nesting(store, tmp_path):
    rows = [
        _row(0, 0, "linear", T0, T0 + 1000),
        _row(0, 1, "gelu", T0 + 900, T0 + 2000),                      # starts before its sibling ended
        _row(0, 2, "layer_norm", T0 + 2000, T0 + 5000),
        _row(0, 3, "mean", T0 + 2100, T0 + 5200, depth=1),            # child ends after its parent
        _row(0, 4, "mul", T0 + 2100, T0 + 2100, depth=1),             # zero length, same start as a sibling
        _row(1, 0, "linear", T0 + 6000, T0 + 7000),
        _row(1, 1, "linear", T0 + 6000, T0 + 7000, thread=78),       # another thread
    ]
    rid = make_run(store, rows)
    out = tmp_path / "t.json"
    rep = export(store, rid, "chrome", out)
    doc = load_chrome(out)
    cats = check_chrome(doc)
    assert cats["forward"] == len(rows) and rep["ops"] == len(rows)
    assert cats["step"] == 3                                          # step 0 and 1 on thread 77, step 1 on 78
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "forward"]
    gelu = next(e for e in ops if e["name"] == "gelu")
    assert gelu["ts"] == 1.0 and gelu["args"]["fallback"] is True     # clamped to the sibling's end
    assert gelu["args"]["input_shapes"] == "[[2,8]]" and gelu["args"]["flops"] == 128
    assert {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"} == {"sim:npu-a1 (npu)"}
    assert doc["otherData"]["run_id"] == rid


def test_chrome_export_has_memory_counters_and_python_stacks(store, tmp_path):
    rows = [_row(0, i, "add", T0 + i * 100, T0 + i * 100 + 50) for i in range(4)]
    memory = [(0, i, T0 + i * 100 + 50, "sim:npu-a1", 1000 * (i + 1), 1000, 0) for i in range(4)]
    stacks = [(T0, 400, 5, 0, "forward (model.py:10)"), (T0 + 10, 100, 5, 1, "linear (functional.py:1)")]
    rid = make_run(store, rows, memory, stacks)
    out = tmp_path / "t.json.gz"
    export(store, rid, "chrome", out, gzip=True)
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    doc = json.loads(gzip.decompress(out.read_bytes()))
    cats = check_chrome(doc)
    assert cats["counter"] == 4 and cats["stack"] == 2 and cats["forward"] == 4
    counters = [e["args"]["live_bytes"] for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters == [1000, 2000, 3000, 4000]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert "python stacks" in names


def test_perfetto_export_decodes_with_balanced_slices_and_counters(store, tmp_path):
    rows = [_row(0, 0, "linear", T0, T0 + 1000), _row(0, 1, "gelu", T0 + 900, T0 + 2000),
            _row(0, 2, "layer_norm", T0 + 2000, T0 + 5000), _row(0, 3, "mean", T0 + 2100, T0 + 5200, depth=1),
            _row(1, 0, "linear", T0 + 6000, T0 + 7000), _row(1, 1, "linear", T0 + 6000, T0 + 7000, thread=78)]
    memory = [(0, i, T0 + i * 1000, "sim:npu-a1", 10 * i, 0, 0) for i in range(3)]
    rid = make_run(store, rows, memory)
    out = tmp_path / "t.pftrace"
    rep = export(store, rid, "perfetto", out)
    begins = check_perfetto(out.read_bytes())
    assert begins == Counter({"linear": 3, "gelu": 1, "layer_norm": 1, "mean": 1, "step": 3, "<counter>": 3})
    ev = decode_perfetto(out.read_bytes())["events"]
    assert rep["packets"] == decode_perfetto(out.read_bytes())["packets"]
    lin = next(e for e in ev if e["type"] == 1 and e["name"] == "linear")
    # debug annotations carry node, shapes (interned text), FLOPs, bytes and step (numbers)
    assert set(lin["ann"].values()) >= {"linear_0", "[[2,8]]", '["float32"]', "layers.0.mlp", 128, 64, 0}


def test_csv_export_is_the_op_stats_table(store, tmp_path):
    rows = [_row(0, i, op, T0 + i * 100, T0 + i * 100 + 50 + i) for i, op in enumerate(["add", "add", "gelu"])]
    rid = make_run(store, rows)
    out = tmp_path / "ops.csv"
    export(store, rid, "csv", out)
    got = list(csv.DictReader(out.open()))
    want = store.op_stats(rid)
    assert [r["key"] for r in got] == [r["key"] for r in want]
    assert {r["key"]: int(r["count"]) for r in got} == {"add": 2, "gelu": 1}


def test_cli_trace_export_formats_and_errors(store, tmp_path, cli):
    rid = make_run(store, [_row(0, 0, "add", T0, T0 + 10)])
    r = cli("trace", "export", rid[:6], "-o", tmp_path / "x.pftrace", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "perfetto" and doc["run_id"] == rid and doc["ops"] == 1
    r = cli("trace", "export", "nosuchrun", "-o", tmp_path / "x.json")
    assert r.returncode == 2 and "unknown run" in r.stderr and "Traceback" not in r.stderr
    r = cli("trace", "export", rid, "-o", tmp_path / "missing" / "x.json")
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_export_to_a_folder_or_an_unwritable_path_is_a_usage_error_not_a_traceback(store, tmp_path):
    from opscope.runtime.errors import UsageError
    rid = make_run(store, [_row(0, 0, "add", T0, T0 + 10)])
    with pytest.raises(UsageError, match="it is a folder"):
        export(store, rid, "chrome", tmp_path)
    (tmp_path / "x.json").mkdir()            # a folder named like a trace file
    for fmt in ("chrome", "perfetto", "csv"):
        with pytest.raises(UsageError, match="it is a folder"):
            export(store, rid, fmt, tmp_path / "x.json")
    with pytest.raises(UsageError, match="cannot write"):
        export(store, rid, "csv", "/proc/opscope-no-such-file.csv")   # the folder exists; open() fails


@pytest.mark.multiprocess
@pytest.mark.slow
def test_chrome_export_of_demo_gpt_holds_one_event_per_op_per_step(store, tmp_path):
    from opscope.profiler import profile
    rid = profile("demo:gpt", "torch:cpu", steps=2)
    ev = store.events_frame(rid, columns=["step", "node"])
    assert len(ev["node"]) > 0 and len(set(ev["step"].tolist())) == 2
    out = tmp_path / "gpt.json"
    export(store, rid, "chrome", out)
    doc = load_chrome(out)
    cats = check_chrome(doc)
    ops = [e for e in doc["traceEvents"] if e.get("cat") in ("forward", "transfer")]
    want = Counter(zip(ev["step"].tolist(), ev["node"].tolist()))
    got = Counter((e["args"]["step"], e["args"]["node"]) for e in ops)
    assert got == want and all(n == 1 for n in got.values())        # exactly one X per executed op per step
    assert cats["step"] == 2
    # our own export imports back into the same per-op table
    from opscope.profiler.importers import import_trace
    back = import_trace(out, store=store)
    assert {r["key"]: r["count"] for r in store.op_stats(back)} == {r["key"]: r["count"] for r in store.op_stats(rid)}
    pf = tmp_path / "gpt.pftrace"
    export(store, rid, "perfetto", pf)
    begins = check_perfetto(pf.read_bytes())
    assert begins["step"] == 2 and sum(begins.values()) - 2 - begins["<counter>"] == len(ops)
