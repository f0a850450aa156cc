"""The web analyzer on a training run (`profile --train`): the phase band, backward -> forward links,
Operators by phase and forward vs backward per module, Memory by category with the peak's owner."""
import shutil
import time

import numpy as np
import pytest

from opscope.app.web import phases
from opscope.app.web import timeline as lod
from opscope.app.web.data import WebData
from opscope.profiler import profile
from opscope.profiler.store import RunStore


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("web-train") / "runs.duckdb")
    rid = profile("demo:mlp", "sim:npu-a1", steps=2, train={"optimizer": "sgd"}, store=store)
    return store, rid


def test_phase_segments_join_stretches_and_skip_transfers():
    # step 0: forward, forward, transfer, forward, backward, optimizer; step 1: forward
    start = [0, 10, 20, 30, 40, 60, 100]
    end = [10, 20, 30, 40, 60, 70, 110]
    step = [0, 0, 0, 0, 0, 0, 1]
    phase = [0, 0, -1, 0, 1, 2, 0]
    assert lod.phase_segments(start, end, step, phase) == [(0, 0, 40, 0), (0, 40, 60, 1), (0, 60, 70, 2),
                                                          (1, 100, 110, 0)]


def test_timeline_of_a_training_run_has_a_phase_band_over_each_step(trained):
    store, rid = trained
    data = WebData(store)
    run = data.run(rid)
    spans = data.spans(run)
    assert spans.tracks[:2] == ["steps", "phases"] and spans.bands == 2
    band = np.flatnonzero(spans.key0 == lod.PHASE_KEY)
    got = sorted((int(spans.key1[i]) // 8, spans.names[spans.label[i]]) for i in band)
    assert got == [(s, p) for s in (0, 1) for p in sorted(lod.PHASES)]
    # each phase span covers exactly its phase's ops of that step (on the timeline's axis)
    rows = store.query("SELECT step, phase, min(start_ns), max(end_ns) FROM events WHERE run_id = ? "
                       "GROUP BY step, phase", [rid])
    shifts = data.step_shifts(run)
    for i in band:
        step, p = divmod(int(spans.key1[i]), 8)
        _, _, a, b = next(r for r in rows if r[0] == step and r[1] == lod.PHASES[p])
        assert (spans.start[i], spans.end[i]) == (a - shifts.get(step, 0), b - shifts.get(step, 0))
    # the band does not count as spans: the op count is the events'
    assert spans.count == run["events"]
    body, status = __import__("opscope.app.pages.timeline", fromlist=["window"]).window(data, {"run": rid})
    assert status == 200 and body["tracks"][1] == "phases"
    assert {"forward", "backward", "optimizer"} <= set(body["legend"])


def test_backward_details_name_the_forward_op_with_a_link_that_selects_it(trained):
    from opscope.app.pages.timeline import FORWARD, _forward_link
    store, rid = trained
    data = WebData(store)
    step, seq, fwd = store.query("SELECT step, seq, fwd_node FROM events WHERE run_id = ? AND phase = 'backward' "
                                 "AND fwd_node <> '' AND step = 1 ORDER BY seq LIMIT 1", [rid])[0]
    ev = data.event(rid, step, seq)
    link, target = _forward_link(data, rid, ev)
    text = str(link)
    assert "backward of" in text and fwd in text and FORWARD in text
    fstep, fseq, module = store.query("SELECT step, seq, module FROM events WHERE run_id = ? AND node = ? "
                                      "AND phase = 'forward' AND step = 1", [rid, fwd])[0]
    assert target["key"][:2] == [fstep, fseq]
    assert (module or "(top level)") in text
    # the target lies where that op is drawn
    spans = data.spans(data.run(rid))
    i = np.flatnonzero((spans.key0 == fstep) & (spans.key1 == fseq))[0]
    assert target["start"] == spans.start[i] - spans.t_min and target["end"] == spans.end[i] - spans.t_min
    # a forward op says nothing more
    fwd_ev = data.event(rid, fstep, fseq)
    assert _forward_link(data, rid, fwd_ev) == (None, None)


def test_operators_group_by_phase_and_forward_vs_backward_per_module(trained):
    store, rid = trained
    data = WebData(store)
    run = data.run(rid)
    rows = phases.phase_rows(data, run)
    got = {r["key"]: r for r in rows if r["kind"] == "device"}
    assert {"forward", "backward", "optimizer"} <= set(got)
    want = dict((p, (n, t)) for p, n, t in store.query(
        "SELECT phase, count(*), sum(end_ns - start_ns) FROM events WHERE run_id = ? AND device LIKE 'sim:%' "
        "GROUP BY phase", [rid]))
    for p, (n, t) in want.items():
        assert (got[p]["count"], got[p]["total_ns"]) == (n, t)
    mods = {m["module"]: m for m in phases.module_phases(data, run)}
    # a backward op counts for the module of the forward op it differentiates
    want_b = store.query(
        """SELECT f.module, sum(b.end_ns - b.start_ns) FROM events b JOIN events f
             ON f.run_id = b.run_id AND f.step = b.step AND f.node = b.fwd_node AND f.phase = 'forward'
           WHERE b.run_id = ? AND b.phase = 'backward' AND f.module <> '' GROUP BY 1""", [rid])
    assert want_b
    for module, ns in want_b:
        assert mods[module]["backward_ns"] == ns and mods[module]["forward_ns"] > 0


def test_memory_categories_on_the_timeline_axis_with_the_peaks_owner(trained):
    store, rid = trained
    data = WebData(store)
    run = data.run(rid)
    cats = phases.memory_categories(data, run)
    tl = run["config"]["train"]["memory_timeline"]
    assert cats["steps"] == 2 and len(cats["t"]) == 2 * len(tl["seq"])
    assert cats["parameter"][:len(tl["seq"])] == tl["parameter"]
    assert all(b >= a for a, b in zip(cats["t"], cats["t"][1:]))       # in time order, step after step
    peak = cats["peak"]
    assert peak["owner"] == tl["peak"]["owner"] and peak["t"] is not None and peak["op"]
    from opscope.app.pages.memory import _category_peak, category_figure
    windows = data.step_windows(rid, run)
    axis = (windows[0][1], windows[-1][2])
    fig = category_figure(cats, axis)
    names = {t["name"] for t in fig["data"] if t.get("stackgroup")}
    assert {"parameter", "gradient", "activation"} <= names
    assert "owner: " in str(_category_peak(run, cats, axis)) and peak["owner"].replace("_", " ") in \
        str(_category_peak(run, cats, axis))


def test_an_inference_run_has_no_phase_band(tmp_path):
    store = RunStore(tmp_path / "runs.duckdb")
    from opscope.runtime.models import load
    model, inputs = load("demo:mlp")
    rid = profile("demo:mlp", "numpy", steps=1, store=store, model=model, inputs=inputs)
    data = WebData(store)
    run = data.run(rid)
    assert data.spans(run).tracks[1] != "phases" and not phases.is_training(data, run)
    assert phases.memory_categories(data, run) is None


# --- in the browser ----------------------------------------------------------------------------------------

@pytest.mark.browser
@pytest.mark.slow
def test_browser_training_timeline_shows_three_phases_and_memory_its_categories(trained, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from opscope.app.web.browser import headless_chromium
    from opscope.app.web.server import create_app, start_in_thread
    store, rid = trained
    srv, url = start_in_thread(create_app(store=store))
    driver = headless_chromium(str(tmp_path / "chrome"))

    def until(script, *args, timeout=90):
        t0 = time.time()
        while time.time() - t0 < timeout:
            v = driver.execute_script(script, *args)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out: {script}")
    try:
        driver.get(f"{url}/timeline?run={rid}")
        got = until("var t = window.opscopeTimeline; var n = t && t.namesOn('phases');"
                    "return n && n.length ? n : null;")
        assert got == ["backward", "forward", "optimizer"]
        # click a backward phase span: the details say which phase and step
        pt = until("return window.opscopeTimeline.pointOf(-4, 1 * 8 + 1);")
        from selenium.webdriver.common.action_chains import ActionChains
        over = driver.find_element("css selector", "#timeline-graph .tl-over")
        r = driver.execute_script("var r = arguments[0].getBoundingClientRect();"
                                  "return [r.left, r.top, r.width, r.height];", over)
        ActionChains(driver).move_to_element_with_offset(over, pt["x"] - r[0] - r[2] / 2,
                                                         pt["y"] - r[1] - r[3] / 2).click().perform()
        until("var e = document.getElementById('timeline-details');"
              "return e && e.innerText.indexOf('backward') >= 0 && e.innerText.indexOf('phase') >= 0;")
        driver.get(f"{url}/memory?run={rid}")
        until("var g = document.querySelector('#memory-categories-graph .js-plotly-plot');"
              "return g && g.data && g.data.length > 2;")
        names = driver.execute_script("return document.querySelector('#memory-categories-graph .js-plotly-plot')"
                                      ".data.filter(function (t) { return t.stackgroup; })"
                                      ".map(function (t) { return t.name; });")
        assert {"parameter", "gradient", "activation"} <= set(names)
        until("var e = document.getElementById('memory-categories-peak');"
              "return e && e.innerText.indexOf('owner') >= 0;")
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()
