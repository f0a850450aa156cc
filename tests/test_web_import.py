"""Imported torch.profiler traces in the web analyzer (issue 15 point 4): the annotations (record_function,
ProfilerStep) on lanes of their own per thread, the Python stacks of `with_stack`, the flows from a launch to its
kernel (drawn when one end is picked), the memory samples of `profile_memory` on the Memory page and the timeline.

One trace is made here by a real torch.profiler run (the CLI imports it, as a user would); the other is the Kineto
GPU trace of tests/test_trace_import.py (launches, kernels on a stream, ac2g flows)."""
import json
import shutil

import numpy as np
import pytest
import torch

from opscope.app.web import timeline as lod
from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore

from test_trace_import import STREAM, _write, kineto_gpu_trace
from test_web_security import _callback_body, _server_callbacks

pytestmark = pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
TIMEOUT = 90          # bounds a hang on a shared machine; not a speed check
STEPS = 3


def profiled_training(path):
    """Three training steps under torch.profiler with shapes, stacks and memory, each step in a record_function,
    the schedule's steps marked by prof.step(); the Chrome trace exported to `path`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=True, profile_memory=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=0, active=STEPS, repeat=1)) as prof:
        for step in range(STEPS):
            with torch.profiler.record_function(f"train_step_{step}"):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            prof.step()
    prof.export_chrome_trace(str(path))


@pytest.fixture(scope="module")
def cpu_import(tmp_path_factory):
    """(store, run id) of the real trace, imported with `opscope trace import` into a home of its own."""
    from conftest import run_cli
    home = tmp_path_factory.mktemp("import-home")
    trace = home / "train.pt.trace.json"
    profiled_training(trace)
    r = run_cli("trace", "import", str(trace), "--json", env={"OPSCOPE_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-2000:]
    return RunStore(home / "runs.duckdb"), json.loads(r.stdout)["run_id"]


def timeline_of(store, rid, **query):
    q = "&".join(f"{k}={v}" for k, v in {"run": rid, "px": 1400, **query}.items())
    return create_app(store=store).server.test_client().get(f"/_opscope/timeline?{q}").get_json()


def drawn(p) -> list[tuple[str, str, int, int]]:
    """(track, name, key0, key1) of every span the timeline endpoint drew as itself."""
    sp = p["spans"]
    tracks, labels = lod.unb64(sp["track"], "i4"), lod.unb64(sp["label"], "i4")
    return [(p["tracks"][t], p["names"][k], int(a), int(b))
            for t, k, a, b in zip(tracks, labels, lod.unb64(sp["key0"], "f8"), lod.unb64(sp["key1"], "f8"))]


def flows(p) -> list[tuple[float, str, float, str]]:
    f = p["flows"]
    return list(zip(lod.unb64(f["from"], "f8"), [p["tracks"][k] for k in lod.unb64(f["from_track"], "i4")],
                    lod.unb64(f["to"], "f8"), [p["tracks"][k] for k in lod.unb64(f["to_track"], "i4")]))


def callback(app, key_part, *args):
    c = app.server.test_client()
    c.get("/")
    key, cb = next((k, cb) for k, cb in _server_callbacks(app).items() if key_part in k)
    r = c.post("/_dash-update-component", json=_callback_body(key, cb, list(args)))
    assert r.status_code == 200, r.get_data(as_text=True)[-500:]
    return json.loads(r.get_data(as_text=True))["response"]


def test_record_function_steps_are_drawn_on_an_annotation_lane_of_their_thread(cpu_import):
    store, rid = cpu_import
    p = timeline_of(store, rid)
    spans = drawn(p)
    lane = next(t for t in p["tracks"] if t.endswith(" · annotations"))
    assert p["tracks"].index(lane) < p["tracks"].index("torch:cpu")        # above the ops they wrap
    notes = {(t, n) for t, n, k0, _ in spans if k0 == lod.ANNOTATION_KEY}
    # ProfilerStep#N wraps train_step_N (one lane deeper), which wraps the optimizer's own annotations
    assert {(lane, f"ProfilerStep#{s}") for s in range(STEPS)} <= notes
    assert {("↳ annotations depth 1", f"train_step_{s}") for s in range(STEPS)} <= notes
    assert any(n.startswith("Optimizer.step") for _, n in notes)
    assert not any(n.startswith("PyTorch Profiler") for _, n in notes)      # the whole-trace span says nothing
    # each annotation span is the one stored: the same times, and the details panel names it
    sp = store.spans_frame(rid)
    k1 = next(k1 for t, n, k0, k1 in spans if n == "train_step_1")
    row = WebDataOf(store).annotation(rid, k1)
    assert row["name"] == "train_step_1" and row["kind"] == "user_annotation"
    i = list(sp["name"]).index("train_step_1")
    assert (row["start_ns"], row["end_ns"]) == (sp["start_ns"][i], sp["end_ns"][i])
    app = create_app(store=store)
    body = json.dumps(callback(app, "timeline-details", [lod.ANNOTATION_KEY, k1, 1.0],
                               {"run": rid, "status": "ok", "events": 1, "dropped": 0}))
    assert "train_step_1" in body and "user annotation" in body


def WebDataOf(store):
    from opscope.app.web.data import WebData
    return WebData(store)


def test_the_stacks_of_with_stack_are_drawn_under_the_ops(cpu_import):
    store, rid = cpu_import
    p = timeline_of(store, rid)
    frames = {n for t, n, k0, _ in drawn(p) if k0 == lod.STACK_KEY}
    assert "python stack 0" in p["tracks"] and p["tracks"].index("python stack 0") > p["tracks"].index("torch:cpu")
    # the frames with_stack recorded, at every depth (issue 27: depth 8 and below were dropped), are named and drawn
    stored = {f for f, in store.query("SELECT DISTINCT frame FROM stacks WHERE run_id = ?", [rid])}
    assert frames and frames <= stored and stored <= set(p["names"][p["frames_from"]:])
    assert any("profiled_training" in f for f, in store.query("SELECT frame FROM stacks WHERE run_id = ?", [rid]))


def test_forward_to_backward_flows_join_two_ops_on_the_timeline(cpu_import):
    store, rid = cpu_import
    p = timeline_of(store, rid)
    stored = store.flows_frame(rid)
    got = flows(p)
    assert len(got) == len(stored["kind"]) > 0
    origin = int(p["origin"])
    # each end lies on a span of the track it is drawn on (the op it came from, the op it goes to): checked on
    # the run's spans, as most backward ops are too short to draw one by one in a whole-run window
    sp = WebDataOf(store).spans(store.get_run(rid))
    on = (lambda track, t: bool(((tracks == sp.tracks.index(track)) & (sp.start <= t) & (sp.end >= t)).any()))
    tracks = np.searchsorted(sp.offsets, np.arange(len(sp.start)), "right") - 1
    pairs = set(zip(stored["from_ns"].tolist(), stored["to_ns"].tolist()))
    for a, ta, b, tb in got:
        assert (int(a) + origin, int(b) + origin) in pairs
        assert on(ta, int(a) + origin) and on(tb, int(b) + origin)


def test_memory_samples_of_profile_memory_show_on_the_memory_page_and_the_timeline(cpu_import):
    store, rid = cpu_import
    peak = store.query("SELECT max(live_bytes), count(*) FROM memory WHERE run_id = ?", [rid])[0]
    assert peak[1] > 0
    p = timeline_of(store, rid)
    live = next(c for c in p["counters"] if c["name"].startswith("live bytes"))
    assert live["max"] == peak[0] and live["n"] > 1
    resp = callback(create_app(store=store), "memory-graph", {"run": rid, "status": "ok", "events": 1, "dropped": 0})
    line = next(t for t in resp["memory-graph"]["figure"]["data"] if t["name"] == "torch:cpu")
    assert len(line["y"]) == peak[1] and max(line["y"]) == pytest.approx(peak[0] / 2 ** 20)   # every sample, MiB
    assert "Peak on torch:cpu" in json.dumps(resp["memory-peaks"])


def test_kineto_gpu_launches_point_at_their_kernels(tmp_path, opscope_home):
    rid = import_trace(_write(tmp_path, "gpu.pt.trace.json", kineto_gpu_trace()))
    store = RunStore()
    p = timeline_of(store, rid)
    lanes = p["tracks"]
    runtime = next(t for t in lanes if t.endswith("cuda runtime"))
    stream = f"cuda:0 · stream {STREAM}"
    assert stream in lanes and any(t.startswith(stream) and t.endswith("annotations") for t in lanes), lanes
    notes = {(t, n) for t, n, k0, _ in drawn(p) if k0 == lod.ANNOTATION_KEY}
    assert (runtime, "cudaLaunchKernel") in notes and any(n.startswith("ProfilerStep") for _, n in notes)
    got = flows(p)
    assert len(got) == len(store.flows_frame(rid)["kind"]) == 7
    spans = drawn(p)
    start, end = lod.unb64(p["spans"]["start"], "f8"), lod.unb64(p["spans"]["end"], "f8")
    for a, ta, b, tb in got:                          # each arrow: a launch on the host to a kernel on the stream
        assert ta == runtime and tb == stream and a < b
        launch = [n for (t, n, *_), s in zip(spans, start) if t == ta and s == a]
        kernel = [n for (t, n, *_), s in zip(spans, start) if t == tb and s == b]
        assert launch and launch[0].startswith("cuda") and kernel, (launch, kernel)


@pytest.mark.browser
@pytest.mark.slow
def test_in_a_browser_picking_a_kernel_draws_the_arrow_from_its_launch(tmp_path, opscope_home):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from selenium.webdriver.common.action_chains import ActionChains
    from test_web_browser import _hover_at, until

    from opscope.app.web.browser import headless_chromium
    rid = import_trace(_write(tmp_path, "gpu.pt.trace.json", kineto_gpu_trace()))
    store = RunStore()
    kernel = store.query("SELECT step, seq FROM events WHERE run_id = ? AND op = 'kernel' ORDER BY start_ns LIMIT 1",
                         [rid])[0]
    srv, url = start_in_thread(create_app(store=store))
    driver = headless_chromium(str(tmp_path / "chrome"))
    try:
        driver.set_window_size(1500, 1000)
        driver.get(f"{url}/timeline?run={rid}")
        tracks = until(driver, "var t = window.opscopeTimeline && window.opscopeTimeline.tracks();"
                               "return t && t.length ? t : null;", timeout=TIMEOUT)
        assert any(t.endswith("cuda runtime") for t in tracks) and any(t.endswith("annotations") for t in tracks)
        # the gutter's labels: a name too long for it keeps its last part (a thread's annotation and runtime
        # lanes differ only there) and shortens what comes before; no two tracks read the same
        labels = driver.execute_script("return window.opscopeTimeline.labels();")
        assert len(labels) == len(tracks) and len(set(labels)) == len(labels), labels
        cut = [(t, lab) for t, lab in zip(tracks, labels) if lab != t]
        assert cut, labels                         # this trace's host lanes are too long for the gutter
        for t, lab in cut:
            head, _, tail = t.rpartition(" · ")
            assert lab.endswith(" · " + tail) and lab[:-len(" · " + tail)].rstrip("…") in head, (t, lab)
        assert driver.execute_script("return window.opscopeTimeline.flowsDrawn();") == []   # nothing picked
        pt = until(driver, "return window.opscopeTimeline.pointOf(arguments[0], arguments[1]);", *kernel,
                   timeout=TIMEOUT)
        _hover_at(driver, pt["x"], pt["y"])
        ActionChains(driver).click().perform()
        arrows = until(driver, "var f = window.opscopeTimeline.flowsDrawn(); return f.length ? f : null;",
                       timeout=TIMEOUT)
        assert all(a["fromTrack"].endswith("cuda runtime") and a["toTrack"].startswith("cuda:0 · stream")
                   for a in arrows), arrows
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()
