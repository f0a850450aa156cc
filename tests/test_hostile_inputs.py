"""Hostile traces through `trace import` and `advise` (issue 24): every file is built here from real output --
an ONNX Runtime profile as ORT writes it, a Chrome trace written by opscope's exporter, a torch.profiler trace
recorded here -- then edited the way an attacker would. Each either imports with what it holds bounded (names
cut, shapes that are not lists dropped, both said in one line) or is refused with exit 2 and one line; the
advisor never tracebacks on what was stored: a bundled rule the data breaks is skipped with a note.
"""
import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.profiler.advisor import report
from opscope.profiler.advisor.analyses import from_frame
from opscope.profiler.importers import common, import_trace, kineto
from opscope.profiler.store import RunStore
from opscope.runtime.errors import UsageError
from test_import_fuzz import _opscope_export
from test_trace_import import opscope_main, ort_profile, torch_profiler_trace

BIG = 2 * 1024 * 1024          # the op name: 2 MB


def _ort_with_huge_names():
    """An ORT profile whose Gemm nodes are called by a 2 MB op type (the longest op of the run, so the
    bundled dominant-op rule puts it in its title)."""
    events = ort_profile(runs=2)
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("args", {}).get("op_name") == "Gemm":
            ev["args"]["op_name"] = "A" * BIG
            ev["dur"] = 5000
    return events


def _import_and_advise(capsys, path):
    """`opscope trace import PATH --json` then `opscope advise RUN --json`: -> (import doc, advise code, doc, err)."""
    code, out, err = opscope_main(capsys, "trace", "import", path, "--json")
    assert code == 0 and "Traceback" not in err, err
    doc = json.loads(out)
    code, out, err = opscope_main(capsys, "advise", doc["run_id"], "--json")
    assert "Traceback" not in err, err
    return doc, code, (json.loads(out) if code == 0 else None), err


def test_an_ort_op_name_of_2_mb_is_cut_on_import_and_every_bundled_rule_advises(tmp_path, capsys):
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(_ort_with_huge_names()))
    doc, code, advice, err = _import_and_advise(capsys, path)
    assert doc["cut"]["names"] == {"op": 4} and doc["cut"]["max_name"] == common.MAX_NAME
    ops = RunStore().query("SELECT max(length(op)) FROM events WHERE run_id = ?", [doc["run_id"]])[0][0]
    assert ops == common.MAX_NAME                      # cut, ending in the mark, not 2 MB
    assert code == 0 and advice["skipped_rules"] == [] and err == "", err
    top = next(a for a in advice["advice"] if a["rule"] == "dominant-op")
    assert top["title"].startswith("AAAA") and common.CUT_MARK in top["title"]
    # the text command says what it cut in one line
    code, out, err = opscope_main(capsys, "trace", "import", path)
    assert code == 0 and err.count("names past 4096 characters cut (op)") == 1, err


def test_a_bundled_rule_the_stored_data_breaks_is_skipped_with_a_note_not_blamed_on_the_rule(tmp_path, capsys,
                                                                                             monkeypatch):
    """A store written before the bound (or by anything else) can hold the 2 MB name: the dominant-op rule's
    title then passes the template's 100,000-character bound. That rule is skipped with a one-line note, the
    others still advise, exit 0; before, the run got exit 2 blaming profiler/rules/generic.toml."""
    monkeypatch.setattr(common, "MAX_NAME", 4 * BIG)          # the import keeps the name whole
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(_ort_with_huge_names()))
    doc, code, advice, err = _import_and_advise(capsys, path)
    assert "cut" not in doc or doc["cut"] is None
    assert code == 0, err
    assert [s["rule"] for s in advice["skipped_rules"]] == ["dominant-op"]
    assert "100,000 characters" in advice["skipped_rules"][0]["reason"]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: note: rule 'dominant-op' skipped"), err
    code, out, err = opscope_main(capsys, "advise", doc["run_id"])           # the table too
    assert code == 0 and "skipped" in err and len(err.strip().splitlines()) == 1, err


def test_a_rule_from_the_users_pack_that_fails_is_still_their_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "MAX_NAME", 4 * BIG)
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(_ort_with_huge_names()))
    code, out, err = opscope_main(capsys, "trace", "import", path, "--json")
    pack = tmp_path / "mine.toml"
    pack.write_text('[[rule]]\nid = "mine"\ntitle = "{dominant.top_op}"\nmessage = "m"\ncondition = "true"\n')
    code, out, err = opscope_main(capsys, "advise", json.loads(out)["run_id"], "--rules", pack)
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(pack) in err and "'mine'" in err, err


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A Chrome trace written by opscope's exporter from a run profiled here."""
    return _opscope_export(tmp_path_factory.mktemp("export"))


@pytest.mark.parametrize("field,value", [("input_dtypes", 5), ("output_dtypes", 7), ("input_shapes", 3),
                                         ("input_dtypes", "5"), ("output_shapes", {"a": 1}), ("input_dtypes", "[")])
def test_our_export_with_an_int_where_a_list_belongs_imports_unknown_and_advises(tmp_path, capsys, export,
                                                                                 field, value):
    doc = copy.deepcopy(export)
    for ev in doc["traceEvents"]:
        if isinstance(ev.get("args"), dict) and field in ev["args"]:
            ev["args"][field] = value
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps(doc))
    imported, code, advice, err = _import_and_advise(capsys, path)   # was: TypeError 'int' object is not iterable
    assert code == 0 and advice["skipped_rules"] == [], err
    assert imported["cut"]["shapes"] == {field: imported["events"]}
    stored = RunStore().query(f"SELECT count({field}) FROM events WHERE run_id = ?", [imported["run_id"]])[0][0]
    assert stored == 0                         # unknown (NULL), not the text "5"


def test_the_advisor_reads_stored_dtypes_that_are_not_lists_as_unknown():
    """Runs imported before the check keep such text: the analyses read it as no dtype, never a TypeError."""
    frame = {"step": [0, 0], "seq": [0, 1], "op": ["linear", "relu"], "node": ["a", "b"], "backend": ["x", "x"],
             "device": ["cpu", "cpu"], "depth": [0, 0], "start_ns": [0, 10], "end_ns": [5, 20],
             "input_dtypes": ["5", '{"a": 1}'], "output_dtypes": ["[[[", '["float16"]'], "bytes": [None, 1],
             "flops": [1, None], "fallback": [False, False], "live_bytes": [0, 0], "phase": ["forward"] * 2,
             "rank": [0, 0]}
    data = from_frame({"run_id": "r", "backend": "x", "config": {"dist": {"backends": 5, "steps": 3},
                                                                  "train": {"memory_timeline": 7}}}, frame)
    assert [e["dtype"] for e in data.events] == ["float32", "float16"]


# --- trace metadata: distributedInfo and times ----------------------------------------------------------
@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "trace.json"
    torch_profiler_trace(path, steps=2, schedule=True)
    return json.loads(path.read_text())


def _one_line_exit_2(code, out, err, *words):
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank,world,says", [
    (0, 1e12, "world_size is 1000000000000.0"), (0, 10 ** 12, "world_size is 1000000000000"),
    (0, 65537, "world_size is 65537"), (0, 0, "world_size is 0"), (0, -4, "world_size is -4"),
    (0, "4", "world_size is '4'"), (0, 2.5, "world_size is 2.5"),
    (4, 4, "rank is 4"), (-1, 4, "rank is -1"), (2 ** 70, 4, "rank is 1180591620717411303424"),
    (None, 4, "rank is None"), (1.5, 4, "rank is 1.5"),
])
def test_distributed_info_out_of_bounds_is_refused_before_it_sizes_anything(tmp_path, capsys, torch_trace,
                                                                            rank, world, says):
    doc = dict(torch_trace, distributedInfo={"backend": "gloo", "rank": rank, "world_size": world})
    one = tmp_path / "rank.json"
    one.write_text(json.dumps(doc))
    code, out, err = opscope_main(capsys, "trace", "import", one)
    _one_line_exit_2(code, out, err, str(one), "distributedInfo", says)
    # a folder of per-rank traces: before, world_size 10**12 built set(range(10**12)) to find the missing ranks
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "r0.json").write_text(json.dumps(doc))
    code, out, err = opscope_main(capsys, "trace", "import", folder)
    _one_line_exit_2(code, out, err, "distributedInfo", says)


def test_the_largest_world_size_and_any_rank_inside_it_import(tmp_path, torch_trace):
    store = RunStore()
    for rank, world in ((3, 4), (kineto.MAX_WORLD_SIZE - 1, kineto.MAX_WORLD_SIZE), (1, 2.0)):
        path = tmp_path / "rank.json"
        path.write_text(json.dumps(dict(torch_trace, distributedInfo={"backend": "gloo", "rank": rank,
                                                                      "world_size": world})))
        ev = store.events_frame(import_trace(path, store=store), columns=["rank", "world_size"])
        assert set(ev["rank"].tolist()) == {rank} and set(ev["world_size"].tolist()) == {int(world)}


def test_a_folder_missing_many_ranks_names_a_few_in_one_line(tmp_path, capsys, torch_trace):
    """Issue 27: the ranks present import (as HTA analyses them), with one warning line naming a few missing."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "r0.json").write_text(json.dumps(dict(torch_trace, distributedInfo={"rank": 0, "world_size": 65536})))
    code, out, err = opscope_main(capsys, "trace", "import", folder)
    warned = [ln for ln in err.splitlines() if ln.startswith("opscope: warning:")]
    assert code == 0 and len(warned) == 1 and "Traceback" not in err, err
    assert "1 of 65536 ranks imported; rank(s) 1, 2," in warned[0] and "and 65515 more" in warned[0]


@pytest.mark.parametrize("which", ["instant", "metadata", "counter"])
@pytest.mark.parametrize("ts", [9.3e15, -9.3e15, 2 ** 64, "9.3e15"])
def test_a_time_past_int64_nanoseconds_in_any_event_is_refused(tmp_path, capsys, torch_trace, which, ts):
    """Not only the spans read as ops: an instant, a metadata event or a counter whose ts (us) * 1000 passes
    int64 ns imported with exit 0 before (the held-out fuzz corpus's case)."""
    doc = copy.deepcopy(torch_trace)
    ph = {"instant": "i", "metadata": "M", "counter": "C"}[which]
    at = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == ph) if ph != "C" else None
    if at is None:
        doc["traceEvents"].append({"ph": "C", "name": "live memory", "pid": 1, "ts": ts, "args": {"live_bytes": 1}})
        at = len(doc["traceEvents"]) - 1
    else:
        doc["traceEvents"][at]["ts"] = ts
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    code, out, err = opscope_main(capsys, "trace", "import", path)
    _one_line_exit_2(code, out, err, str(path), f"event {at} ", "'ts'", "64-bit nanoseconds")


def test_an_ort_profile_with_a_time_past_int64_in_an_event_it_skips_is_refused(tmp_path, capsys):
    events = ort_profile(runs=1) + [{"ph": "i", "cat": "Session", "name": "mark", "ts": 9.3e15, "pid": 1, "tid": 1}]
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(events))
    code, out, err = opscope_main(capsys, "trace", "import", path)
    _one_line_exit_2(code, out, err, str(path), "'ts'")


# --- fuzz: the new cases, through import and the advisor -----------------------------------------------
LONG = ["x" * (common.MAX_NAME + 1), "[" * 3000, "y" * 70_000, "[/]" * 2000]
HOSTILE_META = [10 ** 12, 1e12, 65537, -1, 0, 2 ** 70, "4", None, [], {}, 1.5, 3]
mutation = st.one_of(
    st.tuples(st.just("name"), st.integers(0, 10 ** 6), st.sampled_from(["name", "cat"]), st.sampled_from(LONG)),
    st.tuples(st.just("args"), st.integers(0, 10 ** 6),
              st.sampled_from(["op_name", "provider", "node", "module", "input_shapes", "input_dtypes",
                               "output_shapes", "output_dtypes", "input_type_shape", "phase"]),
              st.sampled_from(LONG + [5, -1, {"a": [1]}, "5", [1, [2]], "[1,", None])),
    st.tuples(st.just("ts"), st.integers(0, 10 ** 6), st.just("ts"), st.sampled_from([9.3e15, -9.3e15, 2 ** 64,
                                                                                       "9.3e15", 1e308])),
    st.tuples(st.just("dist"), st.integers(0, 1), st.sampled_from(["rank", "world_size"]),
              st.sampled_from(HOSTILE_META)),
)


def _mutate(doc, mutations):
    doc = copy.deepcopy(doc)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for kind, i, key, value in mutations:
        if kind == "dist":
            if isinstance(doc, dict):
                doc.setdefault("distributedInfo", {"backend": "gloo", "rank": 0, "world_size": 2})[key] = value
            continue
        ev = events[i % len(events)]
        if kind in ("name", "ts"):
            ev[key] = value
        else:
            if not isinstance(ev.get("args"), dict):
                ev["args"] = {}
            ev["args"][key] = value
    return doc


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", ["onnxruntime", "opscope", "torch.profiler"])
def test_fuzz_long_names_wrong_types_bad_metadata_import_bounded_and_advise_without_a_traceback(
        tmp_path, seed, export, torch_trace):
    seeds = {"onnxruntime": ort_profile(runs=2), "opscope": export, "torch.profiler": torch_trace}
    store = RunStore()

    @settings(max_examples=20, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutations=st.lists(mutation, min_size=1, max_size=4))
    def fuzz(mutations):
        path = tmp_path / "mutated.json"
        path.write_text(json.dumps(_mutate(seeds[seed], mutations)))
        try:
            rid = import_trace(path, store=store)
        except UsageError as e:
            assert "\n" not in str(e) and str(path) in str(e), str(e)
            return
        names = store.query("SELECT max(length(op)), max(length(node)), max(length(coalesce(module, ''))), "
                            "max(world_size), min(rank) FROM events WHERE run_id = ?", [rid])[0]
        assert max(names[:3]) <= common.MAX_NAME and 1 <= names[3] <= kineto.MAX_WORLD_SIZE and names[4] >= 0
        for col in common.SHAPE_COLUMNS:
            for (v,) in store.query(f"SELECT DISTINCT {col} FROM events WHERE run_id = ? AND {col} IS NOT NULL",
                                    [rid]):
                assert isinstance(json.loads(v), list) and len(v) <= common.MAX_SHAPES
        skipped: list = []
        report(rid, store, skipped=skipped)          # never raises on what the import stored

    fuzz()


def test_an_export_with_an_int_world_size_past_the_bound_does_not_allocate(tmp_path, capsys, export):
    """Our own export carries no distributedInfo; one added by hand is read the same way as torch's."""
    doc = dict(export, distributedInfo={"rank": 0, "world_size": 2 ** 40})
    path = tmp_path / "e.json"
    path.write_text(json.dumps(doc))
    code, out, err = opscope_main(capsys, "trace", "import", path)
    _one_line_exit_2(code, out, err, "distributedInfo", "world_size is 1099511627776")
