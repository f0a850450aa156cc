"""Hostile trace files (issue 11): every importer answers exit 2 with one line naming the file, or imports
correctly -- never a traceback, a hang, a wrapped time or a zero-length span made from a bad one.

The seeds are real: a torch.profiler trace and an opscope Chrome export are recorded here, next to the
Kineto GPU trace and the ONNX Runtime profile of test_trace_import. Hypothesis mutates them the way the
fuzzer of issue 11 did: values replaced by lists, objects, numbers past int64, negatives, strings;
keys deleted; events replaced; files cut short.
"""
import copy
import gzip
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore
from opscope.runtime.errors import UsageError
from test_trace_import import TinyNet, kineto_gpu_trace, opscope_main, ort_profile, torch_profiler_trace

HOSTILE = [[], [1, 2], {"a": 1}, {}, [[[[1]]]], 2 ** 63, 2 ** 64 + 5, -(2 ** 63) - 1, 10 ** 30, 1e308, -1e308,
           9.3e15, -1, -1.5, 0, "", "abc", "12", "1e400", "-5", None, True, "x" * 300, float("nan"),
           "n" * 5000, "[" * 2000]            # issue 24: names past the bound, shapes that are not lists
EVENT_KEYS = ["ts", "dur", "pid", "tid", "ph", "cat", "name", "args", "id"]
ARG_KEYS = ["External id", "correlation", "Input Dims", "Input type", "stream", "device", "bytes", "step", "seq",
            "node", "module", "input_shapes", "flops", "fallback", "op_name", "provider", "input_type_shape",
            "output_type_shape", "name"]
TOP_KEYS = ["traceEvents", "otherData", "t0_ns", "opscope", "model", "backend", "device"]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """name -> a real trace document."""
    tmp = tmp_path_factory.mktemp("seeds")
    torch_profiler_trace(tmp / "torch.json", steps=2, schedule=True)
    return {"torch.profiler": json.loads((tmp / "torch.json").read_text()), "kineto-gpu": kineto_gpu_trace(),
            "onnxruntime": ort_profile(runs=2), "opscope": _opscope_export(tmp)}


def _opscope_export(tmp):
    """A run profiled here (in process, numpy backend), exported by `opscope trace export`'s code."""
    from opscope.profiler import profile
    from opscope.profiler.export import export
    store = RunStore(tmp / "runs.duckdb")          # a module fixture runs before the per-test home exists
    torch.manual_seed(0)
    rid = profile("tinynet", "numpy", model=TinyNet(), inputs=(torch.randn(8, 16),), steps=2, store=store)
    export(store, rid, "chrome", tmp / "opscope.json")
    return json.loads((tmp / "opscope.json").read_text())


# --- mutations ------------------------------------------------------------------------------------------
mutation = st.one_of(
    st.tuples(st.just("event"), st.integers(0, 10 ** 6), st.sampled_from(EVENT_KEYS), st.sampled_from(HOSTILE)),
    st.tuples(st.just("delete"), st.integers(0, 10 ** 6), st.sampled_from(EVENT_KEYS), st.none()),
    st.tuples(st.just("args"), st.integers(0, 10 ** 6), st.sampled_from(ARG_KEYS), st.sampled_from(HOSTILE)),
    st.tuples(st.just("whole"), st.integers(0, 10 ** 6), st.none(), st.sampled_from(HOSTILE)),
    st.tuples(st.just("top"), st.integers(0, 10 ** 6), st.sampled_from(TOP_KEYS), st.sampled_from(HOSTILE)),
)


def mutate(doc, mutations):
    doc = copy.deepcopy(doc)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for kind, i, key, value in mutations:
        value = copy.deepcopy(value)           # HOSTILE's objects are shared between examples
        if kind == "top":
            if isinstance(doc, dict):
                target = doc.setdefault("otherData", {}) if key in ("t0_ns", "opscope", "model", "backend",
                                                                    "device") else doc
                if isinstance(target, dict):
                    target[key] = value
            continue
        if not isinstance(events, list) or not events:
            continue
        i %= len(events)
        ev = events[i]
        if kind == "whole":
            events[i] = value
        elif isinstance(ev, dict) and kind == "event":
            ev[key] = value
        elif isinstance(ev, dict) and kind == "delete":
            ev.pop(key, None)
        elif isinstance(ev, dict) and kind == "args":
            if not isinstance(ev.get("args"), dict):
                ev["args"] = {}
            ev["args"][key] = value
    return doc


def time_bounds(doc) -> tuple[float, float]:
    """The widest span (ns) that the file's own numbers allow: an imported time outside it was wrapped."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    other = doc.get("otherData") if isinstance(doc, dict) else None
    t0 = other.get("t0_ns") if isinstance(other, dict) else 0
    t0 = t0 if isinstance(t0, (int, float)) and not isinstance(t0, bool) else 0
    lo, hi = math.inf, -math.inf
    for ev in events if isinstance(events, list) else []:
        if not isinstance(ev, dict):
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur", 0))
        if ts is None:
            continue
        lo = min(lo, ts * 1000, ts * 1000 + t0)
        hi = max(hi, (ts + max(dur or 0, 0)) * 1000, (ts + max(dur or 0, 0)) * 1000 + t0)
    return lo - 2 - abs(lo) * 1e-12, hi + 2 + abs(hi) * 1e-12


def _num(v):
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def check_import(path, store, doc=None):
    """Exit 2's one line, or a correct run: -> the run id, or None when refused."""
    try:
        rid = import_trace(path, store=store)
    except UsageError as e:
        msg = str(e)
        assert "\n" not in msg and str(path) in msg, msg
        return None
    run = store.get_run(rid)
    assert run["status"] == "ok" and run["events"] > 0
    ev = store.events_frame(rid, columns=["start_ns", "end_ns", "step", "seq", "thread"])
    start, end = ev["start_ns"].astype(np.float64), ev["end_ns"].astype(np.float64)
    assert len(start) == run["events"] and (ev["end_ns"] >= ev["start_ns"]).all()
    assert int(ev["end_ns"].max()) - int(ev["start_ns"].min()) < 2 ** 63
    if doc is not None:
        lo, hi = time_bounds(doc)
        assert start.min() >= lo and end.max() <= hi, (start.min(), end.max(), lo, hi)
    assert (ev["step"] >= 0).all() and (ev["seq"] >= 0).all()
    # issue 24: names within the bound, shapes and dtypes JSON lists (what the advisor and the pages read)
    from opscope.profiler.importers.common import MAX_NAME, SHAPE_COLUMNS
    assert max(store.query("SELECT max(length(op)), max(length(node)) FROM events WHERE run_id = ?",
                           [rid])[0]) <= MAX_NAME
    for col in SHAPE_COLUMNS:
        for (v,) in store.query(f"SELECT DISTINCT {col} FROM events WHERE run_id = ? AND {col} IS NOT NULL", [rid]):
            assert v.startswith("[") and v.endswith("]"), v
    return rid


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("seed", ["torch.profiler", "kineto-gpu", "onnxruntime", "opscope"])
def test_mutated_traces_import_or_exit_2_with_one_line(seeds, seed, tmp_path):
    store = RunStore()
    assert check_import(_write(tmp_path / "seed.json", seeds[seed]), store, seeds[seed])   # the seed imports

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutations=st.lists(mutation, min_size=1, max_size=4), cut=st.none() | st.floats(0, 1))
    def fuzz(mutations, cut):
        doc = mutate(seeds[seed], mutations)
        data = json.dumps(doc).encode()          # NaN goes out as the NaN token, which JSON readers refuse
        if cut is not None:
            data = data[: int(len(data) * cut)]
        path = tmp_path / "mutated.json"
        path.write_bytes(data)
        check_import(path, store, doc)

    fuzz()


def _write(path, doc, compact=False):
    """compact: without spaces, as opscope's exporter writes (otherData last takes typed.py's one-pass road)."""
    path.write_text(json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc))
    return path


# --- named cases the fuzzer of issue 11 found, each through the importer -----------------------------
def _x(**kw):
    return dict({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 10, "dur": 2, "pid": 1, "tid": 1}, **kw)


@pytest.mark.parametrize("event,why", [
    (_x(ts=2 ** 64 + 5), "'ts'"),
    (_x(ts=9.3e15), "'ts'"),                 # 9.3e18 ns: past int64 after the us -> ns conversion
    (_x(ts=-9.3e15), "'ts'"),
    (_x(ts=9.2e15, dur=1e14), "'dur'"),        # the start fits, the end does not
    (_x(ts=1e308), "'ts'"),
    (_x(dur=-5), "'dur'"),
    (_x(ts="1e400"), "'ts'"),
])
def test_times_outside_int64_nanoseconds_are_refused_naming_the_event(tmp_path, event, why):
    for events in ([event], [event] + [_x(ts=20 + i) for i in range(3)]):
        path = _write(tmp_path / "t.json", {"traceEvents": events})
        with pytest.raises(UsageError) as e:
            import_trace(path, store=RunStore())
        assert why in str(e.value) and "event 0 ('aten::add')" in str(e.value) and "\n" not in str(e.value)


def test_the_largest_times_that_fit_import_exactly_and_a_run_spans_less_than_int64(tmp_path):
    store = RunStore()
    for ts in (9.2e15, -9.2e15):
        path = _write(tmp_path / "t.json", {"traceEvents": [_x(ts=ts, dur=1)]})
        ev = store.events_frame(import_trace(path, store=store), columns=["start_ns", "end_ns"])
        assert ev["start_ns"].tolist() == [int(ts) * 1000] and (ev["end_ns"] - ev["start_ns"]).tolist() == [1000]
    # each time fits, but not the distance between them, which every view subtracts
    path = _write(tmp_path / "t.json", {"traceEvents": [_x(ts=9.2e15, dur=1), _x(ts=-9.2e15, dur=1)]})
    with pytest.raises(UsageError, match="span"):
        import_trace(path, store=store)


@pytest.mark.multiprocess
def test_ids_given_as_lists_objects_or_past_int64_import_deterministically(tmp_path):
    events = [_x(pid=[1, 2], tid={"a": 1}, ts=10), _x(pid=[1, 2], tid={"a": 1}, ts=11, dur=1),
              _x(pid=2 ** 70, tid=2 ** 64 - 1, ts=20),
              _x(cat="kernel", name="k", pid=0, tid=7, ts=12, dur=1,
                 args={"correlation": [1], "External id": {"x": 1}, "stream": [7], "device": {}, "bytes": 2 ** 64})]
    path = _write(tmp_path / "ids.json", {"traceEvents": events})
    store = RunStore()
    rows = []
    for _ in range(2):
        ev = store.events_frame(import_trace(path, store=store), columns=["thread", "depth", "device", "bytes"])
        rows.append(sorted(zip(*(ev[c].tolist() for c in ("thread", "depth", "device", "bytes")))))
    assert rows[0] == rows[1] and len(rows[0]) == 4
    # the two ops on the list/object ids share one lane: the second nests in the first
    assert sorted(d for _, d, dev, _ in rows[0] if dev.startswith("cpu")) == [0, 0, 1]
    # the same ids in another process (Python salts its str hash per process) give the same threads
    code = ("import sys; from opscope.profiler.importers import parse_trace; "
            "t, _ = parse_trace(sys.argv[1]); print(sorted(t.columns()[0]['thread'].tolist()))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == sorted(t for t, *_ in rows[0])


# --- reads that must stay bounded: FIFOs, devices, folders, gzip bombs -------------------------------
def _one_line_exit_2(code, out, err, path):
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:") and str(path) in lines[0], err


def test_fifos_devices_and_folders_are_refused_before_they_are_read(tmp_path, capsys):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)                   # no writer: opening it for reading would block for ever
    for path, what in ((fifo, "FIFO"), ("/dev/zero", "device"), ("/dev/null", "device"), (tmp_path, "folder")):
        code, out, err = opscope_main(capsys, "trace", "import", path)
        _one_line_exit_2(code, out, err, path)
        assert what in err


def _gzip_bomb(path, gigabytes=3):
    """A few MB that gunzip to `gigabytes` GB of zeros: one 64 MiB member, repeated (gzip allows many)."""
    member = gzip.compress(bytes(64 << 20), 9)
    with open(path, "wb") as f:
        for _ in range(gigabytes * 16):
            f.write(member)
    return path


@pytest.mark.multiprocess
def test_a_gzip_bomb_is_refused_with_one_line_and_bounded_memory(tmp_path):
    """`opscope trace import` in a child process of its own, so its peak memory can be read: the default
    limit is 2 GiB and the bomb expands to 3 GB; reading it whole, or up to the limit, costs gigabytes."""
    bomb = _gzip_bomb(tmp_path / "bomb.json.gz")
    assert bomb.stat().st_size < 8 << 20
    out, err = tmp_path / "out", tmp_path / "err"
    # NOTE: a small launcher forks the import: Linux keeps a process's peak RSS across exec, so a child
    # forked straight from this (by now large) pytest process would report pytest's own peak
    launcher = ("import os, sys\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT), 1)\n"
                "    os.dup2(os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT), 2)\n"
                "    os.execv(sys.executable, [sys.executable, '-m', 'opscope.app', 'trace', 'import', sys.argv[3]])\n"
                "_, status, usage = os.wait4(pid, 0)\n"
                "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", launcher, str(out), str(err), str(bomb)], capture_output=True,
                       text=True, timeout=300)
    code, maxrss_kib = map(int, r.stdout.split())
    _one_line_exit_2(code, out.read_text(), err.read_text(), bomb)
    assert "bomb" in err.read_text()
    assert maxrss_kib * 1024 < 1 << 30, f"peak memory {maxrss_kib // 1024} MiB"


def test_gzipped_traces_still_import_whole(tmp_path):
    trace = tmp_path / "t.json"
    torch_profiler_trace(trace)
    data = trace.read_bytes()
    one = tmp_path / "one.json.gz"
    one.write_bytes(gzip.compress(data))
    two = tmp_path / "two.json.gz"                 # two gzip members, as `cat a.gz b.gz` makes
    two.write_bytes(gzip.compress(data[:1000]) + gzip.compress(data[1000:]))
    store = RunStore()
    plain = store.get_run(import_trace(trace, store=store))["events"]
    assert store.get_run(import_trace(one, store=store))["events"] == plain
    assert store.get_run(import_trace(two, store=store))["events"] == plain
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(one.read_bytes()[:-20])
    with pytest.raises(UsageError, match="damaged gzip"):
        import_trace(truncated, store=store)


# --- a few of the above through the real command line ---------------------------------------------
@pytest.mark.multiprocess
def test_hostile_files_through_the_cli_exit_2_with_one_line(tmp_path, cli):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    huge = _write(tmp_path / "huge.json", {"traceEvents": [_x(ts=2 ** 64 + 5)]})
    ids = _write(tmp_path / "ids.json", {"traceEvents": [_x(pid=[1], tid={"a": [2]}), _x(ts=1e308)]})
    for path in (fifo, "/dev/zero", huge, ids):
        r = cli("trace", "import", path, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr, r.stderr
    ok = _write(tmp_path / "ok.json", {"traceEvents": [_x(pid=[1], tid={"a": [2]}), _x(ts=9.2e15)]})
    r = cli("trace", "import", ok, "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert RunStore().get_run(json.loads(r.stdout)["run_id"])["events"] == 2


def _outcome(path, store):
    """-> ('refused', the line) or ('ok', every stored column of every event, and the run's config)."""
    # NOTE: one connection held over the import and the reads: each call's own open of the DuckDB file was ~70% of
    # the fuzzer's time (the calls inside share an open one cheaply); what is imported and read is the same
    with store.connect():
        try:
            rid = import_trace(path, store=store)
        except UsageError as e:
            return "refused", str(e)
        frame = store.events_frame(rid)
        run = store.get_run(rid)
        # and what the trace holds besides ops: stacks, spans, flows, kernel args, memory
        beside = {t: store.query(f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = ? ORDER BY ALL", [rid])
                  for t in ("stacks", "spans", "flows", "kernel_args", "memory")}
        store.delete_run(rid)
    return "ok", {k: v.tolist() for k, v in frame.items()}, run["steps"], run["config"], beside


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("seed", ["opscope", "torch.profiler", "kineto-gpu"])
def test_typed_decoding_imports_exactly_what_dict_decoding_does(seeds, seed, tmp_path, monkeypatch):
    """opscope's own export and Chrome/Kineto traces made of the usual fields decode into typed events
    (importers/typed.py), every other file into dicts: on a real trace and on its mutations both roads must
    end in the same run -- ops, stacks, spans, flows, kernel args, memory, config -- or the same refusal."""
    from opscope.profiler.importers import typed
    store = RunStore()
    decode = typed.decode
    took: list = []

    def typed_road(data):
        events = decode(data)
        took.append(events is not None)
        return events

    def outcomes(path):
        monkeypatch.setattr(typed, "decode", typed_road)
        fast = _outcome(path, store)
        monkeypatch.setattr(typed, "decode", lambda data: None)
        return fast, _outcome(path, store)

    for compact in (False, True):          # opscope's two typed roads: events found first, or one pass
        fast, slow = outcomes(_write(tmp_path / "seed.json", seeds[seed], compact))
        assert took.pop() and fast[0] == "ok" and fast == slow
    one_pass = []

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutations=st.lists(mutation, min_size=1, max_size=4), compact=st.booleans())
    def fuzz(mutations, compact):
        path = _write(tmp_path / "mutated.json", mutate(seeds[seed], mutations), compact)
        one_pass.append(typed._EXPORT_TAIL in path.read_bytes()[-4096:])
        fast, slow = outcomes(path)
        assert fast == slow

    fuzz()
    assert took.count(True) > 20            # most mutations still take the typed road
    if seed == "opscope":
        assert one_pass.count(True) > 20    # and many of them the one-pass road


@pytest.mark.multiprocess
@pytest.mark.slow
def test_typed_decoding_of_a_real_architectures_training_export_matches_dict_decoding(tmp_path, monkeypatch):
    """The same two roads on material not shaped here: transformers' GPT-2 (random weights, two blocks)
    trained two steps on torch:cpu, exported with its phases, forward links and live memory."""
    transformers = pytest.importorskip("transformers")
    from opscope.profiler import profile
    from opscope.profiler.export import export
    from opscope.profiler.importers import typed

    class LM(torch.nn.Module):            # the contract: the model returns the loss
        def __init__(self):
            super().__init__()
            cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                          use_cache=False, bos_token_id=0, eos_token_id=0)
            self.gpt = transformers.GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.gpt(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    store = RunStore()
    rid = profile("gpt2", "torch:cpu", steps=2, model=LM(), inputs=(torch.randint(0, 500, (2, 16)),),
                  train={"optimizer": "adamw"}, store=store)
    path = tmp_path / "gpt2-train.json"
    export(store, rid, "chrome", path)
    assert typed.decode(path.read_bytes()) is not None           # the export takes the typed road
    fast = _outcome(path, store)
    monkeypatch.setattr(typed, "decode", lambda data: None)
    slow = _outcome(path, store)
    assert fast[0] == "ok" and fast == slow
    phases = set(fast[1]["phase"])
    assert {"forward", "backward", "optimizer"} <= phases and len(fast[1]["op"]) > 500


@pytest.mark.multiprocess
@pytest.mark.slow
def test_args_that_do_not_decode_refuse_the_file_as_dict_decoding_does(tmp_path, monkeypatch):
    """A torch.profiler trace's args stay JSON text until read (typed.KinetoEvent): a number past a double's
    range where an import reads it -- an op's input dims, an annotation's or a memory sample's args -- refuses
    the file with the line the dict road gives, before anything is stored. Args nobody reads (a Python
    frame's, an op's strides) are not decoded, so there it imports where the dict road refuses: the one
    difference, for a number torch never writes."""
    from opscope.profiler.importers import typed
    trace = tmp_path / "with_stack.json"
    torch.manual_seed(0)
    model, x = TinyNet(), torch.randn(8, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, profile_memory=True) as prof:
        with torch.profiler.record_function("step"):
            model(x)
    prof.export_chrome_trace(str(trace))
    doc = json.loads(trace.read_text())
    store = RunStore()

    def with_huge(cat, key="huge"):
        d = copy.deepcopy(doc)
        ev = next(e for e in d["traceEvents"] if e.get("cat") == cat and (key == "huge" or key in e["args"]))
        ev["args"][key] = "HUGE"
        path = tmp_path / f"{cat}.json"
        path.write_text(json.dumps(d).replace('"HUGE"', "1e999"))
        assert typed.decode(path.read_bytes()) is not None      # the typed road takes it
        return path

    for cat, key in (("cpu_op", "Input Dims"), ("user_annotation", "huge"), ("cpu_instant_event", "huge")):
        path = with_huge(cat, key)
        fast = _outcome(path, store)
        with monkeypatch.context() as m:
            m.setattr(typed, "decode", lambda data: None)
            slow = _outcome(path, store)
        assert fast[0] == "refused" and fast == slow and "out of range" in fast[1], (cat, fast)
    assert store.list_runs() == []
    assert _outcome(with_huge("python_function"), store)[0] == "ok"
    assert _outcome(with_huge("cpu_op", "Input Strides"), store)[0] == "ok"


def test_an_event_whose_phase_is_a_list_is_counted_not_a_traceback(tmp_path):
    """Found by the fuzzer (more examples than CI runs): a torch.profiler trace with one event's "ph" a list
    reached the flow pairing, which looked the phase up in a dict -- TypeError. It is now an event of an
    unknown kind, counted as dropped; the ops import as from the trace as torch wrote it."""
    trace = tmp_path / "torch.json"
    torch_profiler_trace(trace, steps=2, schedule=True)
    doc = json.loads(trace.read_text())
    odd = next(e for e in doc["traceEvents"] if e.get("ph") == "i")
    odd["ph"] = []
    store = RunStore()
    runs = [store.get_run(import_trace(path, store=store))
            for path in (trace, _write(tmp_path / "ph.json", doc))]
    assert runs[1]["events"] == runs[0]["events"] > 0
    dropped = [r["config"]["import"]["kinds_dropped"] for r in runs]
    assert sum(dropped[1].values()) == sum(dropped[0].values())
    assert {k: v for k, v in dropped[1].items() if k not in dropped[0]} == {"ph:[]": 1}, dropped
