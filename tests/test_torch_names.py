"""Issue 27 on a real torch.profiler training trace (recorded here: 4 AdamW steps, shapes, memory, stacks,
record_function): ops keep the trace's names (`aten::mm`) in the Operators table, the find box, CSV and Chrome
export and compare; a grouping never counts a nested op twice; an export re-imports to the same run (names,
annotations, flows, every stack depth, memory counters); the timeline draws every stack depth and counts it."""
import csv
import json

import pytest

from opscope.app.web import timeline as lod
from opscope.app.web.server import create_app
from opscope.profiler import stats
from opscope.profiler.compare import compare_runs
from opscope.profiler.export import export
from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore

from test_web_security import _callback_body, _server_callbacks
from torch_traces import record_training


@pytest.fixture(scope="module")
def training_trace(tmp_path_factory):
    return record_training(tmp_path_factory.mktemp("trace") / "train.json")


def _import(path) -> str:
    return import_trace(str(path), RunStore())


def _call(app, key, values):
    cb = app.callback_map[key]
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(key, cb, values))
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()["response"]


def test_torch_names_in_the_operators_table_the_find_box_csv_and_compare(training_trace, tmp_path):
    store = RunStore()
    rid = _import(training_trace)
    run = store.get_run(rid)
    app = create_app(store=store)
    _server_callbacks(app)
    key = next(k for k in app.callback_map if k.startswith("..ops-table.rowData"))
    resp = _call(app, key, [{"run": rid, "status": "ok", "events": run["events"], "dropped": 0}, "name", None])
    rows = {r["key"]: r for r in resp["ops-table"]["rowData"]}
    assert "aten::mm" in rows and rows["aten::mm"]["op"] == "matmul"        # the trace's name, the op type beside
    assert "aten::log_softmax" in rows and rows["aten::log_softmax"]["count"] == 4
    # opscope's vocabulary is a grouping to switch to: there, log_softmax's inner _log_softmax is not a 2nd call
    by_op = {r["key"]: r for r in _call(app, key, [{"run": rid, "status": "ok", "events": run["events"],
                                                     "dropped": 0}, "op", None])["ops-table"]["rowData"]}
    assert by_op["log_softmax"]["count"] == 4                                # was 8 for 4 calls
    assert by_op["log_softmax"]["total_ns"] == rows["aten::log_softmax"]["total_ns"]   # the inner time once
    assert "empty_strided" in by_op and "zeros" not in {k for k in by_op if "empty" in k}

    p = app.server.test_client().get(f"/_opscope/timeline?run={rid}&px=800&find=aten::mm").get_json()
    assert "aten::mm" in p["names"] and "matches for 'aten::mm'" in p["info"]
    assert " 0 matches" not in p["info"]

    out = tmp_path / "ops.csv"
    export(store, rid, "csv", out)
    names = {r["key"] for r in csv.DictReader(out.open())}
    assert "aten::mm" in names and "aten::linear" in names

    doc = compare_runs(store, rid, rid)
    assert "aten::mm" in {o["op"] for o in doc["ops"]}
    assert all(o["ratio"] == pytest.approx(1.0) for o in doc["ops"] if o["ratio"])


def test_no_grouping_counts_a_nested_op_twice(training_trace):
    store = RunStore()
    rid = _import(training_trace)
    with store.connect(read_only=True) as con:
        t = stats.run_times(con, rid)
        for by in ("name", "op", "node"):
            rows = stats.op_breakdown(con, rid, by, times=t)
            assert max(r["total_ns"] for r in rows) <= t["host_ns"], by        # no group's total passes the run's
            assert sum(r["self_ns"] for r in rows) == t["host_ns"], by          # self time sums to the step time
            assert all(r["total_pct"] <= 100.0 + 1e-9 for r in rows), by
    for by in ("name", "op"):
        rows = store.op_stats(rid, by=by)
        assert sum(r["share"] for r in rows) == pytest.approx(1.0), by        # shares from self time: nested count
        assert all(r["total_ns"] <= t["host_ns"] for r in rows)
    nested = [r for r in store.op_stats(rid, by="name") if r["key"] == "aten::mm"]
    assert nested and nested[0]["share"] > 0                                   # a nested op is not 0.0 %


_TABLES = {
    "events": "SELECT step, seq, op, node, module, source, depth, start_ns, end_ns, input_shapes, input_dtypes, flops, "
              "phase FROM events WHERE run_id = ? ORDER BY step, seq",
    "spans": "SELECT kind, name, depth, step, start_ns, end_ns, args FROM spans WHERE run_id = ? "
             "ORDER BY start_ns, depth, name",
    "flows": "SELECT kind, flow_id, from_ns, from_step, from_seq, to_ns, to_step, to_seq FROM flows WHERE run_id = ? "
             "ORDER BY from_ns, flow_id",
    "stacks": "SELECT t_ns, dur_ns, depth, frame FROM stacks WHERE run_id = ? ORDER BY t_ns, depth, frame",
    "memory": "SELECT step, seq, t_ns, backend, live_bytes, alloc_bytes, free_bytes FROM memory WHERE run_id = ? "
              "ORDER BY t_ns, step, seq",
}


def test_export_then_import_loses_nothing_the_import_read(training_trace, tmp_path):
    store = RunStore()
    a = _import(training_trace)
    out = tmp_path / "exported.json"
    export(store, a, "chrome", out)
    written = json.loads(out.read_text())["traceEvents"]
    assert "aten::mm" in {e["name"] for e in written}                     # the trace's names, not opscope's
    b = _import(out)
    for table, sql in _TABLES.items():
        x, y = store.query(sql, [a]), store.query(sql, [b])
        assert x == y, f"{table}: {len(x)} rows before, {len(y)} after; first difference " \
                       f"{next(((p, q) for p, q in zip(x, y) if p != q), None)}"
    counts = {t: store.query(f"SELECT count(*) FROM {t} WHERE run_id = ?", [b])[0][0] for t in _TABLES}
    # what the trace holds: 24 record_function annotations (ProfilerStep#, forward/backward/optimizer, AdamW's),
    # forward-backward flows, stacks deeper than 8, memory samples
    assert counts["spans"] >= 24 and counts["flows"] > 0 and counts["memory"] > 0
    assert store.query("SELECT max(depth) FROM stacks WHERE run_id = ?", [b])[0][0] > 8
    ra, rb = store.get_run(a), store.get_run(b)
    assert ra["steps"] == rb["steps"] == 4


def test_the_timeline_draws_every_stack_depth_and_counts_it(training_trace):
    store = RunStore()
    rid = _import(training_trace)
    depth, frames = store.query("SELECT max(depth), count(*) FROM stacks WHERE run_id = ?", [rid])[0]
    ops, notes = (store.query(f"SELECT count(*) FROM {t} WHERE run_id = ?", [rid])[0][0] for t in ("events", "spans"))
    assert depth > 8
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=800").get_json()
    assert f"python stack {depth}" in p["tracks"]                          # was cut at depth 8, silently
    assert p["count"] == ops + frames + notes - 1                          # the profiler's own "Trace" span left out
    assert f"of {p['count']:,} spans in view" in p["info"]
    # zoomed in on the deepest frame: it is drawn, and clicking it finds it
    row = store.query("SELECT t_ns, dur_ns FROM stacks WHERE run_id = ? ORDER BY depth DESC LIMIT 1", [rid])[0]
    t_min = min(store.query("SELECT min(start_ns) FROM events WHERE run_id = ?", [rid])[0][0],
                store.query("SELECT min(t_ns) FROM stacks WHERE run_id = ?", [rid])[0][0],
                store.query("SELECT min(start_ns) FROM spans WHERE run_id = ? AND kind != 'Trace'", [rid])[0][0])
    t0 = row[0] - t_min
    z = create_app(store=store).server.test_client().get(
        f"/_opscope/timeline?run={rid}&px=800&t0={t0}&t1={t0 + max(row[1], 1000)}").get_json()
    tracks = set(lod.unb64(z["spans"]["track"], "i4").tolist())
    assert z["tracks"].index(f"python stack {depth}") in tracks
