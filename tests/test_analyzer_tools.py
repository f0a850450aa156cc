"""The analyzer's Perfetto-class tools (issue 38), below the browser: the flame graph's merged call tree, the
timeline's area summary, allocations paired with frees, and the web console's query in a child process.
The browser tests (test_web_browser_tools.py) drive the same code through the pages."""
import numpy as np
import pytest

from opscope.app.pages.timeline_tools import area_summary, thread_groups
from opscope.app.web import timeline as lod
from opscope.profiler.flame import heaviest, layout, merge
from opscope.profiler.lifetimes import lifetimes, pair
from opscope.profiler.store import RunStore

from test_web_totals import ev, make_run

# thread 1: main [0,100) > f [0,60) > g [10,30); main > h [60,90); main [100,150) > f [100,140); thread 2: other [0,50)
STACKS = [(1, 0, 0, 100, "main"), (1, 1, 0, 60, "f"), (1, 2, 10, 30, "g"), (1, 1, 60, 90, "h"),
          (1, 0, 100, 150, "main"), (1, 1, 100, 140, "f"), (2, 0, 0, 50, "other")]


def test_the_flame_tree_merges_paths_and_self_time_is_total_less_callees():
    t = layout(merge(STACKS))
    node = {(t["depth"][i], t["name"][i]): i for i in range(len(t["name"]))}
    main, f, g, h = (node[k] for k in ((2, "main"), (3, "f"), (4, "g"), (3, "h")))
    assert t["total"][0] == 200 and t["name"][0] == "all"            # the two threads' top-level time
    assert (t["total"][main], t["self"][main], t["calls"][main]) == (150, 20, 2)    # two calls of main merged
    assert (t["total"][f], t["self"][f], t["calls"][f]) == (100, 80, 2)
    assert (t["total"][g], t["self"][g]) == (20, 20) and t["parent"][g] == f
    assert t["x"][h] == t["x"][f] + t["total"][f]                     # siblings side by side, the widest first
    rows = {r["name"]: r for r in heaviest(t)}
    assert rows["f"]["self"] == 80 and rows["main"]["total"] == 150
    assert sum(r["self"] for r in rows.values()) == t["total"][0]     # self times add up to the whole


def test_a_child_is_cut_to_its_parent_and_recursion_counts_once_in_total():
    t = layout(merge([(1, 0, 0, 100, "a"), (1, 1, 50, 130, "a")]))    # a child sampled past its parent's end
    assert t["name"][0] == "all (thread 1)" and t["total"][0] == 100
    assert all(s >= 0 for s in t["self"]) and max(t["total"][1:]) <= 100
    assert heaviest(t)[0]["total"] == 100                               # a inside a: counted once


def spans():
    # thread 1: parent [0,100) with children [10,30) and [50,90) on its "↳" lane; thread 2: other [0,50)
    return lod.build(start=[0, 10, 50, 0], end=[100, 30, 90, 50], track=[0, 1, 1, 2],
                     tracks=["cpu · t1", "\u21b3 depth 1", "cpu · t2"], label=[0, 1, 1, 2],
                     names=["parent", "child", "other"], key0=[0] * 4, key1=[0, 1, 2, 3])


def test_the_area_summary_counts_self_time_once_and_shares_add_up_to_100():
    sp = spans()
    assert thread_groups(sp.tracks).tolist() == [0, 0, 2]
    rows, head = area_summary(sp, 0, 100, [0, 1, 2])
    got = {r["name"]: (r["count"], r["total"], r["self"]) for r in rows}
    assert got == {"parent": (1, 100, 40), "child": (2, 60, 60), "other": (1, 50, 50)}
    assert head["busy"] == 150 and head["threads"] == 2 and head["tracks"] == 3
    assert sum(r["share"] for r in rows) == pytest.approx(100) and all(r["share"] <= 100 for r in rows)
    # cut at the area's edges: [20, 60) of the parent alone; its children there (even one that began before) subtracted
    rows, head = area_summary(sp, 20, 60, [0])
    assert [(r["name"], r["total"], r["self"], r["share"]) for r in rows] == [("parent", 40, 20, 100)]


def test_an_area_with_nothing_in_it_is_empty():
    rows, head = area_summary(spans(), 200, 300, [0, 1, 2])
    assert rows == [] and head["spans"] == 0 and head["length"] == 100


def test_allocations_pair_by_address_and_what_is_never_freed_is_a_leak():
    # (t, addr, bytes): A allocated then freed; B allocated, never freed; C freed but allocated before the trace;
    # A's address reused by D after A's free
    t = [0, 10, 20, 30, 40, 50]
    addr = [1, 2, 1, 3, 1, 1]
    nbytes = [100, 50, -100, -70, 30, -30]
    site = [0, 1, 0, 0, 2, 2]
    life = pair(t, addr, nbytes, site, ["mm", "empty", "add"], ["cpu"] * 6)
    b = life["buffers"]
    assert b["bytes"].tolist() == [100, 50, 30] and b["freed"].tolist() == [True, False, True]
    assert (b["free_ns"] - b["alloc_ns"])[b["freed"]].tolist() == [20, 10]
    assert life["unpaired_frees"] == 1 and life["unpaired_bytes"] == 70
    assert life["peak"]["bytes"] == 150 and life["peak"]["t"] == 10
    assert dict(life["peak"]["held_by"]) == {"mm": 100, "empty": 50}
    sites = {s["site"]: s for s in life["sites"]}
    assert sites["empty"]["never_freed"] == 1 and sites["empty"]["never_freed_bytes"] == 50
    assert sites["mm"]["median_life_ns"] == 20 and sites["add"]["at_peak"] == 0
    assert life["series"]["live"].tolist()[-1] == 50                  # what is still held when the trace ends


def test_the_same_address_on_two_devices_is_two_buffers():
    life = pair([0, 1, 2], [7, 7, 7], [10, 20, -10], [0, 0, 0], ["x"], ["cpu", "cuda:0", "cpu"])
    assert life["buffers"]["freed"].tolist() == [True, False]


def test_a_run_without_allocations_to_pair_says_so(opscope_home):
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000)])
    assert lifetimes(store, store.get_run(rid)) is None


def test_a_plan_keeps_each_buffers_allocating_and_freeing_step():
    import torch

    from opscope.runtime import open_session
    from opscope.runtime.buffers import buffer_lifetimes
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    s = open_session("tiny", "numpy", model=model, inputs=(torch.randn(2, 8),))
    b = buffer_lifetimes(s.plan)
    assert len(b["seq"]) == len(b["free"]) == len(b["bytes"]) > 0
    assert all(f == -1 or f >= a for a, f in zip(b["seq"], b["free"]))
    assert b["free"][-1] == -1 and b["bytes"][-1] == 2 * 4 * 4       # the output: kept past the step
    assert sum(f >= 0 for f in b["free"]) >= 1                        # intermediates are freed
    assert sum(b["bytes"]) == sum(st.alloc_bytes for st in s.plan.steps)


@pytest.mark.multiprocess
def test_the_web_console_query_runs_in_a_child_with_the_same_sandbox(opscope_home):
    from opscope.profiler.sql import query_in_child
    from opscope.runtime.errors import UsageError
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 1000, 1500)])
    out = query_in_child(rid, "SELECT op, end_ns - start_ns AS ns FROM events ORDER BY seq", store.path)
    assert out["columns"] == ["op", "ns"] and out["rows"] == [["linear", 1000], ["relu", 500]]
    with pytest.raises(UsageError, match="file system operations are disabled"):
        query_in_child(rid, "SELECT * FROM read_csv('/etc/passwd')", store.path)
    with pytest.raises(UsageError, match="the answer is over 32 MB"):     # a few rows, one huge cell: bounded too
        query_in_child(rid, "SELECT repeat('x', 40000000) AS x", store.path)


def test_share_never_passes_100_on_overlapping_spans_of_one_lane():
    # two spans of one lane that overlap (an import's async events): self time is never negative, shares <= 100
    sp = lod.build(start=[0, 20], end=[60, 80], track=[0, 0], tracks=["cpu · t1"], label=[0, 1],
                   names=["a", "b"], key0=[0, 0], key1=[0, 1])
    rows, _ = area_summary(sp, 0, 100, [0])
    assert all(0 <= r["share"] <= 100 for r in rows) and np.isclose(sum(r["share"] for r in rows), 100)


def test_a_graph_runs_ops_nest_under_their_module_paths(opscope_home):
    from opscope.profiler.flame import flame_tree
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 100, module="h.0.attn"), ev(1, "gelu", 100, 150, module="h.0.mlp"),
                           ev(2, "linear", 150, 200, module="h.1.attn"), ev(3, "add", 200, 210)])
    t = flame_tree(store, rid, "ops")
    node = {(t["depth"][i], t["name"][i]): i for i in range(len(t["name"]))}
    assert t["by_module"] and t["root_total"] == 210
    assert t["total"][node[(1, "h")]] == 200 and t["self"][node[(1, "h")]] == 0
    assert t["total"][node[(2, "h.0")]] == 150 and t["total"][node[(3, "h.0.attn")]] == 100
    assert t["parent"][node[(4, "linear")]] in (node[(3, "h.0.attn")], node[(3, "h.1.attn")])
    assert t["total"][node[(1, "add")]] == 10                      # an op with no module: under the thread
    assert sum(r["self"] for r in heaviest(t)) == 210


def _text(component) -> str:
    kids = getattr(component, "children", component)
    if isinstance(kids, (list, tuple)):
        return "".join(_text(k) for k in kids)
    return kids if isinstance(kids, str) else (_text(kids) if kids is not None and kids is not component else "")


def test_the_area_summary_and_the_flame_table_say_which_clock_their_times_are_on():
    from opscope.app.pages.flame import heaviest_table
    from opscope.app.pages.timeline_tools import render
    sp = spans()
    sp.clocks = ["simulated", "simulated", "modelled host"]
    rows, head = area_summary(sp, 0, 100, [0, 1])
    assert head["clocks"] == ["simulated"] and "simulated clock" in _text(render(rows, head, sp))
    rows, head = area_summary(sp, 0, 100, [0, 1, 2])
    assert "modelled host and simulated clock" in _text(render(rows, head, sp))
    t = layout(merge(STACKS))
    assert "times on the host: simulated clock" in _text(heaviest_table(t, "ops", "host: simulated clock"))


def test_an_area_far_outside_the_run_is_cut_to_its_time_not_an_overflow(opscope_home):
    from opscope.app.web.server import create_app

    from test_web_security import _callback_body
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 1000, 1500)])
    app = create_app(store=store)
    key = next(k for k in app.callback_map if k.startswith("timeline-area-out."))
    for t0, t1 in ((-1e300, 1e300), (0, 1e300), (1e300, 2e300)):
        body = _callback_body(key, app.callback_map[key], [{"run": rid, "t0": t0, "t1": t1, "tracks": [0, 1, 2, 3]}])
        r = app.server.test_client().post("/_dash-update-component", json=body)
        assert r.status_code == 200, r.get_data(as_text=True)
    assert "linear" in r.get_data(as_text=True) or "Nothing ran" in r.get_data(as_text=True)
    body = _callback_body(key, app.callback_map[key], [{"run": rid, "t0": 0, "t1": 1e300, "tracks": [0, 1, 2, 3]}])
    assert "linear" in app.server.test_client().post("/_dash-update-component", json=body).get_data(as_text=True)


def test_the_lifetimes_card_says_which_clock_its_times_are_on(opscope_home):
    from opscope.app.web import ids
    from opscope.app.web.server import create_app
    from opscope.profiler import profile
    from opscope.runtime import models

    from test_web_security import _callback_body
    model, inputs = models.load("demo:mlp")
    rid = profile("demo:mlp", "sim:npu-a1", model=model, inputs=inputs, steps=1)
    app = create_app(store=RunStore())
    key = next(k for k in app.callback_map if k.startswith(f"{ids.MEM_LIFETIMES}."))
    status = {"run": rid, "status": "ok", "events": RunStore().get_run(rid)["events"], "dropped": 0}
    body = _callback_body(key, app.callback_map[key], [status])
    text = app.server.test_client().post("/_dash-update-component", json=body).get_data(as_text=True)
    assert "never freed" in text and "device: simulated clock" in text


def test_a_tree_past_max_nodes_leaves_its_narrowest_out_and_the_table_says_so():
    from opscope.app.pages.flame import heaviest_table
    rows = [(1, 0, 0, 1000, "main")] + [(1, 1, 10 * k, 10 * k + (9 if k < 5 else 1), f"f{k}") for k in range(50)]
    whole = layout(merge(rows))
    assert whole["left_out"] == 0 and sum(whole["self"]) == whole["total"][0]
    cut = layout(merge(rows), max_nodes=20)
    assert cut["left_out"] > 0 and len(cut["name"]) <= 20
    assert f"The {cut['left_out']:,} narrowest" in _text(heaviest_table(cut, "stacks"))
    assert "narrowest" not in _text(heaviest_table(whole, "stacks"))


def test_the_live_endpoint_refuses_an_origin_no_clock_can_hold(opscope_home):
    from opscope.app.web.server import create_app
    store = RunStore()
    rid = make_run(store, [ev(0, "linear", 0, 1000), ev(1, "relu", 1000, 1500)])
    client = create_app(store=store).server.test_client()
    ok = client.get(f"/_opscope/live_spans?run={rid}&since=0&origin=500")
    assert ok.status_code == 200 and ok.get_json()["start"] == [-500, 500]
    for origin in (10**30, -10**30, "9" * 4000):
        r = client.get(f"/_opscope/live_spans?run={rid}&since=0&origin={origin}")
        assert r.status_code == 400 and "origin" in r.get_json()["error"]
    # the long poll's wait and the count the page has: a bad one is one line and a 400, never a 500 or a long hold
    for wait in ("-1", "x", "nan", "inf", "6", "1e400"):
        r = client.get(f"/_opscope/live_spans?run={rid}&since=0&wait={wait}")
        assert r.status_code == 400 and "wait is in seconds" in r.get_json()["error"], wait
    for since in ("-1", "x", "1e3", str(2 ** 63), "9" * 5000):
        r = client.get(f"/_opscope/live_spans?run={rid}&since={since}")
        assert r.status_code == 400 and "since" in r.get_json()["error"], since
    far = client.get(f"/_opscope/live_spans?run={rid}&since={2 ** 63 - 1}&wait=0.5").get_json()   # finished: no wait
    assert far["total"] == 2 and far["start"] == []
