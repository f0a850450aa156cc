"""Numbers a perf engineer can trust: a run's time counted once (union of top-level spans, host and device
apart), shares of that time per op, Compare's totals on the same rules, one lane per GPU stream, simulated
steps back to back, the Runs page's durations and steps, and server failures shown as one line."""
import importlib

import pytest

from opscope.app.web import theme
from opscope.app.web import timeline as lod
from opscope.app.web.data import WebData
from opscope.app.web.server import create_app
from opscope.profiler import stats
from opscope.profiler.compare import compare_runs
from opscope.profiler.store import RunStore

from test_web_security import _callback_body, _server_callbacks


def ev(seq, op, t0, t1, *, depth=0, step=0, backend="torch:cpu", device="cpu", thread=1, node=None, module="",
       live=None, flops=0, nbytes=0):
    return (step, seq, op, node or op, module, "", backend, device, thread, depth, t0, t1, "[]", "[]", "[]", "[]",
            nbytes, flops, False, live)


def make_run(store, rows, **kw):
    rid = store.create_run(model=kw.pop("model", "m"), backend=kw.pop("backend", "torch:cpu"),
                           device=kw.pop("device", "cpu"), **kw)
    store.add_events(rid, rows)
    store.finish_run(rid, status="ok")
    return rid


NESTED = [ev(0, "linear", 0, 1000), ev(1, "addmm", 100, 900, depth=1), ev(2, "relu", 1000, 2000)]
HOST_DEVICE = [ev(0, "linear", 0, 1000),
               ev(1, "kernel", 500, 1500, backend="cuda", device="cuda:0", thread=7, node="ampere_sgemm")]


def breakdown(store, rid, by="op"):
    with store.connect(read_only=True) as con:
        return {r["key"]: r for r in stats.op_breakdown(con, rid, by)}


def times(store, rid):
    with store.connect(read_only=True) as con:
        return stats.run_times(con, rid)


def test_union_counts_overlaps_once():
    assert stats.union_ns([0, 100, 1000], [500, 200, 1500]) == 1000
    assert stats.union_ns([0, 10], [100, 20]) == 100                 # nested: the parent's time
    assert stats.union_ns([], []) == 0


def test_a_nested_run_counts_its_time_once_and_shares_self_time(opscope_home):
    store = RunStore()
    rid = make_run(store, NESTED)
    t = times(store, rid)
    assert (t["busy_ns"], t["host_ns"], t["device_ns"]) == (2000, 2000, 0)      # not 2800: addmm is inside linear
    rows = breakdown(store, rid)
    assert rows["addmm"]["self_pct"] == pytest.approx(40.0)          # a nested op's self time counts (was 0 %)
    assert rows["linear"]["total_pct"] == pytest.approx(50.0) and rows["linear"]["self_pct"] == pytest.approx(10.0)
    assert sum(r["self_pct"] for r in rows.values()) == pytest.approx(100.0)


def test_host_and_device_time_are_never_added(opscope_home):
    store = RunStore()
    rid = make_run(store, HOST_DEVICE)
    t = times(store, rid)
    assert (t["busy_ns"], t["host_ns"], t["device_ns"]) == (1500, 1000, 1000)   # not 2000
    rows = breakdown(store, rid)
    assert rows["linear"]["kind"] == "host" and rows["kernel"]["kind"] == "device"
    assert all(r["total_pct"] == pytest.approx(100.0) for r in rows.values())   # each of its own kind's time


def test_compare_totals_follow_the_same_rules_and_warn_of_a_simulated_side(opscope_home):
    store = RunStore()
    a = make_run(store, NESTED, model="mlp")
    b = make_run(store, HOST_DEVICE, model="mlp")
    doc = compare_runs(store, a, b)
    assert doc["total_a_ns"] == 2000 and doc["total_b_ns"] == 1500
    assert doc["totals"]["b"]["host_ns"] == 1000 and doc["totals"]["b"]["device_ns"] == 1000
    assert any("only run B has device time" in w for w in doc["warnings"])
    sim = make_run(store, [ev(0, "linear", 0, 700, backend="npu-a1", device="sim:npu-a1")], model="mlp",
                   backend="npu-a1", device="sim:npu-a1")
    doc = compare_runs(store, a, sim)
    assert doc["totals"]["b"]["simulated"] and any("run B ran on a simulated clock" in w for w in doc["warnings"])


def test_compare_picks_its_runs_in_the_page_so_its_table_waits_on_no_other_callback(opscope_home):
    from opscope.app.pages import compare
    store = RunStore()
    a = make_run(store, NESTED, model="mlp")
    b = make_run(store, HOST_DEVICE, model="mlp")
    other = make_run(store, NESTED, model="cnn")
    app = create_app(store=store)

    def dropdowns(**query):
        with app.server.test_request_context("/compare"):
            page = compare.layout(**query)
        found = {}
        stack = [page]
        while stack:
            c = stack.pop()
            if getattr(c, "id", None) in ("compare-a", "compare-b"):
                found[c.id] = (c.value, [o["value"] for o in c.options])
            elif getattr(c, "id", None) in ("compare-shown", "compare-table"):
                found[c.id] = c.data if c.id == "compare-shown" else [r["op"] for r in c.rowData]
            kids = getattr(c, "children", None)
            stack += kids if isinstance(kids, list) else [kids] if kids is not None else []
        return found
    got = dropdowns(run=a[:8], b=b)                      # an id's prefix is enough, as on the command line
    assert got["compare-a"][0] == a and got["compare-b"][0] == b
    assert set(got["compare-a"][1]) == set(got["compare-b"][1]) == {a, b, other}
    got = dropdowns()                                    # none asked for: the newest two runs of one model
    assert {got["compare-a"][0], got["compare-b"][0]} == {a, b}
    got = dropdowns(run=a)                               # one asked for: the newest other run of its model
    assert (got["compare-a"][0], got["compare-b"][0]) == (a, b)
    got = dropdowns(b=other)                             # none other of its model: the newest other run
    assert (got["compare-a"][0], got["compare-b"][0]) == (b, other)
    # the table's callback takes the dropdowns' values from the page: no callback sets them (it would run first,
    # after the header's run lookup: two round trips in series before the table is even asked for)
    setters = [k for k, cb in _server_callbacks(app).items() if "compare-a.value" in k or "compare-b.value" in k]
    assert setters == []
    key = next(k for k in _server_callbacks(app) if "compare-table.rowData" in k)
    table = _server_callbacks(app)[key]
    assert {(d["id"], d["property"]) for d in table["inputs"]} == {("compare-a", "value"), ("compare-b", "value")}
    assert got["compare-shown"] is None and got["compare-table"] == []     # nothing kept yet: the callback computes
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(key, table, [a, b, None]))
    rows = r.get_json()["response"]["compare-table"]["rowData"]
    assert {row["op"] for row in rows} == {"linear", "addmm", "relu", "kernel"}
    # Now both runs' numbers are kept: the page comes with them drawn (one round trip less), and the callback's
    # first call for those two runs draws nothing again; a pick in a dropdown (a changed input) still draws.
    got = dropdowns(run=a, b=b)
    assert got["compare-shown"] == [a, b] and sorted(got["compare-table"]) == sorted(row["op"] for row in rows)
    first = {**_callback_body(key, table, [a, b, [a, b]]), "changedPropIds": []}
    assert app.server.test_client().post("/_dash-update-component", json=first).status_code == 204
    picked = app.server.test_client().post("/_dash-update-component", json=_callback_body(key, table, [a, b, [a, b]]))
    assert [row["op"] for row in picked.get_json()["response"]["compare-table"]["rowData"]] == \
        [row["op"] for row in rows]
    other_pair = {**_callback_body(key, table, [b, a, [a, b]]), "changedPropIds": []}      # not what the page drew
    assert app.server.test_client().post("/_dash-update-component", json=other_pair).status_code == 200


def test_plotly_starts_with_the_page_only_on_pages_that_draw_with_it(opscope_home):
    """server._EARLY starts plotly.js (a 0.4-2.7 s parse) as a page loads only on the pages marked PLOTS; every page
    that has a dcc.Graph is marked (elsewhere a graph still loads it, later), and Compare draws without it."""
    import inspect
    import json
    import re

    from opscope.app.web.server import PAGES
    modules = [importlib.import_module(f"opscope.app.pages.{name}") for name in PAGES]
    for m in modules:
        assert ("dcc.Graph(" in inspect.getsource(m)) == getattr(m, "PLOTS", False), m.__name__
    index = create_app().server.test_client().get("/compare").get_data(as_text=True)
    early = json.loads(re.search(r"window\.Plotly = (\[.*?\])\.indexOf\(page\)", index).group(1))
    assert sorted(early) == sorted(m.PATH for m in modules if getattr(m, "PLOTS", False))
    assert "/compare" not in early and "/operators" in early


def test_page_layouts_read_the_app_serving_the_request_and_build_a_shell_without_one(opscope_home, tmp_path):
    """Timeline, Flame and Compare find their data through the request's app (several apps may share a process):
    each shows its own app's runs; with no request (Dash validating the layout) the page is its empty shell."""
    from dash import dcc

    from opscope.app.pages import compare, flame, timeline
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 2000, 3000, step=1)])
    store.add_stacks(rid, [(0, 1000, 1, 0, "train.py:12 main")])
    mine, other = create_app(store=store), create_app(store=RunStore(tmp_path / "other.duckdb"))

    def found(page):
        out, stack = {}, [page]
        while stack:
            c = stack.pop()
            if isinstance(c, (dcc.Dropdown, dcc.RadioItems, dcc.Store)):
                out[c.id] = (c.value, c.options) if hasattr(c, "options") else getattr(c, "data", None)
            kids = getattr(c, "children", None)
            stack += kids if isinstance(kids, list) else [kids] if kids is not None else []
        return out

    def pages(app):
        if app is None:
            return found(timeline.layout(run=rid)), found(flame.layout(run=rid)), found(compare.layout(run=rid))
        with app.server.test_request_context("/"):
            return found(timeline.layout(run=rid)), found(flame.layout(run=rid)), found(compare.layout(run=rid))
    tl, fl, cmp = pages(mine)
    assert [o["value"] for o in tl[timeline.ids.TL_STEP][1]] == ["all", 0, 1] and tl[timeline.VIEW]["run"] == rid
    assert fl[flame.ids.FLAME_KIND][0] == "stacks"                   # the run has Python stacks
    assert cmp[compare.ids.CMP_A][0] == rid and [o["value"] for o in cmp[compare.ids.CMP_A][1]] == [rid]
    for app in (other, None):                                        # another app's store, or no request
        tl, fl, cmp = pages(app)
        assert [o["value"] for o in tl[timeline.ids.TL_STEP][1]] == ["all"] and tl[timeline.VIEW] is None
        assert fl[flame.ids.FLAME_KIND][0] == "ops"
    assert cmp[compare.ids.CMP_A] == (rid, [rid]) and cmp[compare.ids.CMP_B] == (None, [])
    cmp = found(compare.layout(run="x", b="y"))                      # each its own placeholder
    assert cmp[compare.ids.CMP_A] == ("x", ["x"]) and cmp[compare.ids.CMP_B] == ("y", ["y"])


def test_one_stream_one_lane_even_when_kernels_overlap_by_a_nanosecond(opscope_home):
    """Kineto's us -> ns rounding makes back-to-back kernels overlap by 1 ns; nesting them was a lie."""
    store = RunStore()
    k = (lambda seq, t0, t1, depth: ev(seq, "kernel", t0, t1, depth=depth, backend="cuda", device="cuda:0",
                                       thread=7, node=f"k{seq}"))
    rid = make_run(store, [k(0, 0, 1000, 0), k(1, 999, 2000, 1), k(2, 1999, 3000, 1), k(3, 2999, 4000, 2)])
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    assert p["tracks"] == ["steps", "cuda:0 · stream 7"]                 # no "↳ depth" lanes
    assert set(lod.unb64(p["spans"]["track"], "i4").tolist()) == {0, 1}
    assert times(store, rid)["device_ns"] == 4000                        # every kernel is top level
    assert all(r["self_ns"] == r["total_ns"] for r in breakdown(store, rid, "node").values())


def test_sim_steps_sit_back_to_back_with_the_gap_marked(opscope_home):
    store = RunStore()
    sim = dict(backend="npu-a1", device="sim:npu-a1")
    rid = make_run(store, [ev(0, "linear", 10**9, 10**9 + 1000, **sim), ev(1, "gelu", 10**9 + 1000, 10**9 + 1500, **sim),
                           ev(0, "linear", 5 * 10**9, 5 * 10**9 + 1000, step=1, **sim),
                           ev(1, "gelu", 5 * 10**9 + 1000, 5 * 10**9 + 1500, step=1, **sim)], **sim)
    data = WebData(store)
    run = data.run(rid)
    assert data.step_windows(rid) == [(0, 10**9, 10**9 + 1500), (1, 10**9 + 1500, 10**9 + 3000)]
    assert data.breaks(run) == [(10**9 + 1500, 4 * 10**9 - 1500)]
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    assert p["end"] == 3000 and p["breaks"] == [[1500, 4 * 10**9 - 1500]]     # 3 us of ops, not 4 s of gap
    assert "device: simulated clock" in p["clock"] and p["clocks"][1] == "simulated"
    # a measured run keeps its gaps: there, idle time is real
    wall = make_run(store, [ev(0, "linear", 0, 1000), ev(0, "linear", 10**6, 10**6 + 1000, step=1)])
    assert WebData(store).step_windows(wall) == [(0, 0, 1000), (1, 10**6, 10**6 + 1000)]


def test_step_track_and_steps_table(opscope_home):
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 1000, 1200),
                           ev(0, "linear", 2000, 5000, step=1), ev(0, "linear", 6000, 6500, step=2)])
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    names = p["names"]
    steps = [(names[lab], s, e) for lab, s, e, tr in zip(lod.unb64(p["spans"]["label"], "i4"),
                                                         lod.unb64(p["spans"]["start"], "f8"),
                                                         lod.unb64(p["spans"]["end"], "f8"),
                                                         lod.unb64(p["spans"]["track"], "i4")) if tr == 0]
    assert sorted(steps) == [("step 0", 0, 1200), ("step 1", 2000, 5000), ("step 2", 6000, 6500)]
    assert p["count"] == 4                          # the info line counts ops, not the step spans
    summary = stats.step_summary(times(store, rid))
    assert summary["count"] == 3 and summary["slowest"]["step"] == 1
    assert summary["mean_ns"] == pytest.approx((1200 + 3000 + 500) / 3)


def _call(app, key, values):
    cb = app.callback_map[key]
    return app.server.test_client().post("/_dash-update-component", json=_callback_body(key, cb, values))


def test_runs_page_shows_trace_time_steps_and_the_empty_state_only_without_runs(opscope_home):
    store = RunStore()
    app = create_app(store=store)
    _server_callbacks(app)
    key = next(k for k in app.callback_map if "runs-actions.children" in k)
    empty = _call(app, key, [None, None]).get_json()
    assert "No runs yet" in str(empty)
    rid = make_run(store, HOST_DEVICE)
    make_run(store, NESTED)
    some = _call(app, key, [None, None]).get_json()
    assert "No runs yet" not in str(some) and "Click a run" in str(some)
    rows = _call(app, "runs-table.rowData", [None]).get_json()["response"]["runs-table"]["rowData"]
    row = next(r for r in rows if r["id"] == rid)
    assert (row["duration"], row["host"], row["device"], row["steps"]) == (1500, 1000, 1000, 1)
    picked = _call(app, key, [{"rowId": rid}, []]).get_json()
    assert "runs-steps-table" in str(picked) and "slowest" in str(picked)


def test_a_callback_that_fails_answers_one_line_the_page_shows(opscope_home):
    """A run whose stored description lacks `implementation` made the Advisor raise: a 500 the page showed as
    'loading…' for ever. The answer is now one line, which the page puts where the advice would go."""
    store = RunStore()
    rid = make_run(store, NESTED, description={"name": "broken", "peak_flops": {"float32": 1e12}})
    app = create_app(store=store)
    _server_callbacks(app)

    def broken(*a, **k):
        raise RuntimeError("the store cannot be read\nsecond line")
    app.opscope_data.op_table = broken
    r = _call(app, next(k for k in app.callback_map if k.startswith("..ops-table.rowData")),
              [{"run": rid, "status": "ok", "events": 3, "dropped": 0}, "op", None])
    assert r.status_code == 500
    assert r.get_data(as_text=True) == "500 server error: RuntimeError: the store cannot be read\n"
    assert "opscopeCallbackFailed" in app.server.test_client().get("/").get_data(as_text=True)


def test_memory_peak_names_the_op_that_held_it(opscope_home):
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000, live=100), ev(1, "gelu", 1000, 2000, live=900, node="gelu_3"),
                           ev(2, "add", 2000, 3000, live=200)])
    data = WebData(store)
    [peak] = data.memory_peaks(data.run(rid))
    assert (peak["op"], peak["node"], peak["seq"], peak["bytes"], peak["t"]) == ("gelu", "gelu_3", 1, 900, 2000)
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    [mem] = p["counters"]                                             # drawn under the timeline, on its axis
    assert mem["name"].startswith("live bytes") and mem["max"] == 900
    assert lod.unb64(mem["t"], "f8").tolist() == [1000, 2000, 3000]


def test_a_counter_thinned_to_its_pixels_keeps_each_pixels_lowest_and_highest_sample():
    import numpy as np
    rng = np.random.default_rng(3)
    t = np.sort(rng.integers(0, 100_000, 5000))
    v = rng.normal(size=5000).round(1)                   # ties: the first of equals is kept
    v[rng.random(5000) < 0.1] = np.nan
    v[(t >= 50_000) & (t < 52_000)] = np.nan             # a pixel of no finite sample keeps its first
    [c] = lod.counter_payload([{"name": "x", "unit": "", "t": t, "v": v}], 0, 0, 100_000, px=50)
    got = set(lod.unb64(c["t"], "f8").astype(np.int64).tolist())
    want = set()
    bucket = t * 50 // 100_000
    for b in np.unique(bucket):
        i = np.flatnonzero(bucket == b)
        w = v[i]
        if np.isfinite(w).any():
            want |= {int(t[i[np.nanargmin(w)]]), int(t[i[np.nanargmax(w)]])}
        else:
            want.add(int(t[i[0]]))
    assert got == want and c["n"] <= 2 * 50 and c["max"] == np.nanmax(v)


def test_module_grouping_rolls_up(opscope_home):
    store = RunStore()
    rid = make_run(store, [ev(0, "matmul", 0, 600, module="h.0.attn"), ev(1, "view", 600, 610, module="h.0.attn"),
                           ev(2, "view", 610, 620, module="h.0.attn"), ev(3, "gelu", 620, 1000, module="h.0.mlp"),
                           ev(4, "add", 1000, 1100, module="h.1.mlp")])
    rows = breakdown(store, rid, "module")
    assert rows["h"]["total_ns"] == 1100 and rows["h.0"]["total_ns"] == 1000 and rows["h.0.attn"]["total_ns"] == 620
    assert rows["h.0.attn"]["op"] == "matmul"                         # the op that takes the time, not the commonest
    with store.connect(read_only=True) as con:
        order = [r["key"] for r in stats.op_breakdown(con, rid, "module")]
    assert order == ["h", "h.0", "h.0.attn", "h.0.mlp", "h.1", "h.1.mlp"]   # a tree, biggest child first


def test_ops_that_sit_side_by_side_have_distinct_colors():
    def dist(a, b):
        x, y = theme.op_color(a), theme.op_color(b)
        return sum(abs(int(x[i:i + 2], 16) - int(y[i:i + 2], 16)) for i in (1, 3, 5))
    for a, b in [("linear", "matmul"), ("softmax", "scaled_dot_product_attention"), ("add", "mul")]:
        assert dist(a, b) > 120, (a, b)
    grey = (0x9a, 0xa5, 0xb1)                                         # timeline.js: spans too small to draw
    view = theme.op_color("view")
    assert sum(abs(int(view[i:i + 2], 16) - g) for i, g in zip((1, 3, 5), grey)) > 90
