"""Web analyzer without a browser: level of detail, the token gate, store queries behind the pages."""
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

from opscope.app.web import theme
from opscope.app.web import timeline as lod
from opscope.app.web.data import WebData
from opscope.app.web.gate import is_loopback
from opscope.app.web.server import create_app, serve
from opscope.profiler.store import RunStore

from conftest import ctrl_c_able


def spans_of(n_small=200_000, n_wide=50, tracks=2, seed=0):
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, 10**9, n_small))
    end = start + rng.integers(1, 200, n_small)                     # 1-200 ns: invisible when zoomed out
    ws = rng.integers(0, 10**9, n_wide)
    start = np.concatenate([start, ws])
    end = np.concatenate([end, ws + 5 * 10**7])                     # 5% of the run: always visible
    n = len(start)
    track = rng.integers(0, tracks, n)
    return lod.build(start, end, track, [f"t{k}" for k in range(tracks)], rng.integers(0, 3, n),
                     ["add", "linear", "gelu"], np.zeros(n), np.arange(n))


def test_lod_draws_few_spans_and_accounts_for_every_span():
    s = spans_of()
    view = lod.level_of_detail(s, s.t_min, s.t_max, px=1000, max_spans=500)
    assert view.visible == s.count
    assert len(view.shown) <= 500 * len(s.tracks)
    assert len(view.b_track) <= 1000 * len(s.tracks)
    assert len(view.shown) + int(view.b_count.sum()) == view.visible
    wide = (s.end - s.start) >= 5 * 10**7
    assert set(np.flatnonzero(wide)) <= set(view.shown.tolist())    # what is visible is drawn as itself


def test_lod_zoomed_in_draws_spans_themselves():
    s = spans_of()
    mid = (s.t_min + s.t_max) // 2
    view = lod.level_of_detail(s, mid, mid + 20_000, px=1000)       # 20 ns per pixel
    assert view.visible > 0
    assert len(view.shown) > 0
    assert len(view.shown) + int(view.b_count.sum()) == view.visible


def test_lod_keeps_spans_that_began_before_the_window():
    s = lod.build([0, 100], [1000, 200], [0, 0], ["cpu"], [0, 0], ["matmul"], [0, 0], [0, 1])
    view = lod.level_of_detail(s, 500, 900, px=100)
    assert view.shown.tolist() == [0]


def test_search_counts_matches_even_in_buckets():
    s = spans_of()
    match = lod.matching(s, "GEL")                                  # case-insensitive: 'gelu'
    assert match.tolist() == [False, False, True]
    view = lod.level_of_detail(s, s.t_min, s.t_max, px=1000, max_spans=500, match=match)
    is_hit = match[s.label]
    assert view.hits == int(is_hit.sum())                            # every span is in the whole-run view
    assert int(view.b_hits.sum()) + int(is_hit[view.shown].sum()) == view.hits
    assert (view.b_hits <= view.b_count).all()
    first = lod.next_match(s, match, s.t_min - 1)
    assert s.label[first] == 2 and s.start[first] == s.start[is_hit].min()
    assert lod.next_match(s, match, s.start[first], forward=False) is None
    assert lod.next_match(s, lod.matching(s, "no such op"), s.t_min) is None


def test_timeline_endpoint_finds_and_goes_to_matches(opscope_home):
    store = RunStore()
    rid = _run_with_events(store, n=20)                            # linear (odd seq) and relu (even), 1 us apart
    c = create_app(store=store).server.test_client()
    p = c.get(f"/_opscope/timeline?run={rid}&px=800&find=Lin").get_json()
    assert [p["names"][k] for k in p["matched"]] == ["linear"]
    assert "10 matches for 'Lin' (10 in view)" in p["info"]
    hits = []
    at = ""
    for _ in range(11):                                             # ten matches, then around again
        g = c.get(f"/_opscope/timeline?run={rid}&find=linear&goto=next&at={at}").get_json()["goto"]
        hits.append(g["key"][1])
        at = g["start"]
    assert hits == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 1]
    back = c.get(f"/_opscope/timeline?run={rid}&find=linear&goto=prev&at=5000").get_json()["goto"]
    assert back["key"][:2] == [0, 3] and back["name"] == "linear"
    assert c.get(f"/_opscope/timeline?run={rid}&find=conv&goto=next").get_json()["goto"] is None
    assert c.get(f"/_opscope/timeline?run={rid}&goto=next").status_code == 400     # nothing to find
    assert c.get(f"/_opscope/timeline?run={rid}&find=x&goto=sideways").status_code == 400


def test_in_window_sums_time_inside_the_window_by_op():
    #            add: 0-1000 (ends at the window's start), mul: 500-2500, add: 1200-1300, frame: 1000-2000
    s = lod.build([0, 500, 1200, 1000], [1000, 2500, 1300, 2000], [0, 0, 0, 1], ["cpu", "python stack 0"],
                  [0, 1, 0, 2], ["add", "mul", "main.py:1 f"], [0, 0, 0, lod.STACK_KEY], [0, 1, 2, 0], frames_from=2)
    top = lod.in_window(s, 1000, 2000)
    got = {s.names[k]: (c, t) for k, c, t in zip(top["label"], top["count"], top["total"])}
    assert got == {"mul": (1, 1000.0), "add": (1, 100.0)}        # mul cut to the window; no Python frame
    assert top["label"][0] == 1 and top["busy"] == 1100.0


def test_payload_carries_every_drawn_span_with_its_event_keys():
    s = spans_of(n_small=1000, n_wide=5)
    view = lod.level_of_detail(s, s.t_min, s.t_max)
    p = lod.payload(s, view)
    sp, bk = p["spans"], p["buckets"]
    assert sp["n"] == len(view.shown) and bk["n"] == len(view.b_track)
    start, end = lod.unb64(sp["start"], "f8"), lod.unb64(sp["end"], "f8")
    assert np.array_equal(start, s.start[view.shown] - s.t_min) and np.array_equal(end, s.end[view.shown] - s.t_min)
    assert np.array_equal(lod.unb64(sp["key1"], "f8"), s.key1[view.shown])          # seq: the click's key
    assert np.array_equal(lod.unb64(sp["track"], "i4"), np.searchsorted(s.offsets, view.shown, "right") - 1)
    assert [p["names"][i] for i in lod.unb64(sp["label"], "i4")] == [s.names[i] for i in s.label[view.shown]]
    assert int(lod.unb64(bk["count"], "f8").sum()) + sp["n"] == view.visible == p["visible"]
    assert p["tracks"] == s.tracks and len(p["colors"]) == len(p["names"]) and p["frames_from"] == 3


def test_payload_times_are_offsets_that_survive_javascript_numbers():
    """Absolute clocks (time.time_ns) are past 2**53: the browser gets offsets from the first span."""
    t = 1_795_977_560_052_123_457
    s = lod.build([t, t + 1001], [t + 1000, t + 3003], [0, 0], ["cpu"], [0, 1], ["add", "mul"], [0, 0], [0, 1])
    p = lod.payload(s, lod.level_of_detail(s, s.t_min, s.t_max, px=100))
    assert p["origin"] == str(t) and p["t0"] == 0 and p["end"] == 3003
    assert lod.unb64(p["spans"]["start"], "f8").tolist() == [0.0, 1001.0]


def test_timeline_endpoint_answers_windows_and_refuses_bad_numbers(opscope_home):
    store = RunStore()
    rid = _run_with_events(store, n=40)
    c = create_app(store=store).server.test_client()
    whole = c.get(f"/_opscope/timeline?run={rid}&px=800").get_json()
    assert whole["run"] == rid and whole["count"] == 40 and whole["visible"] == 40
    assert whole["stamp"] == f"{rid}:40:ok" and "40 of 40 spans in view" in whole["info"]
    part = c.get(f"/_opscope/timeline?run={rid}&t0=0&t1=4500&px=800").get_json()
    assert part["visible"] == 5 and part["t0"] == 0 and part["t1"] == 4500      # spans 0..4 start before 4500
    assert c.get("/_opscope/timeline?px=800").get_json()["run"] == rid           # no ?run=: the newest run
    bad = c.get(f"/_opscope/timeline?run={rid}&t0=abc&t1=3")
    assert bad.status_code == 400 and "must be numbers" in bad.get_json()["error"]
    assert c.get(f"/_opscope/timeline?run={rid}&t0=nan&t1=3").status_code == 400
    assert "No run 'nope'" in c.get("/_opscope/timeline?run=nope").get_json()["message"]


def test_nested_ops_get_a_lane_per_depth_under_their_thread(opscope_home):
    """An imported trace nests aten::linear > aten::addmm: drawn on one row, the child would hide under its parent."""
    store = RunStore()
    rid = store.create_run(model="m", backend="torch:cpu", device="cpu")
    row = (lambda seq, depth, t0, t1, op: (0, seq, op, op, "", "", "torch:cpu", "cpu", 1, depth, t0, t1, "[]", "[]",
                                           "[]", "[]", 0, 0, False, 0))
    store.add_events(rid, [row(0, 0, 0, 1000, "linear"), row(1, 1, 100, 900, "addmm"), row(2, 0, 1000, 2000, "relu")])
    store.finish_run(rid, status="ok")
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    assert p["tracks"] == ["steps", "torch:cpu", "↳ depth 1"]          # the step track first
    lanes = dict(zip((p["names"][i] for i in lod.unb64(p["spans"]["label"], "i4")), lod.unb64(p["spans"]["track"], "i4")))
    assert lanes == {"step 0": 0, "linear": 1, "relu": 1, "addmm": 2}


def test_gpu_kernels_show_their_own_names_on_a_stream_track(opscope_home):
    """An imported GPU trace: a track per stream, each kernel named as itself, colored and listed as 'kernel'."""
    store = RunStore()
    rid = store.create_run(model="m", backend="torch.profiler", device="cpu")
    row = (lambda seq, op, node, backend, device, thread, t0: (0, seq, op, node, "aten::addmm", "", backend, device,
                                                              thread, 0, t0, t0 + 500, "[]", "[]", "[]", "[]", 0, 0,
                                                              False, 0))
    store.add_events(rid, [row(0, "linear", "aten::linear", "torch:cpu", "cpu", 1, 0),
                           row(1, "kernel", "ampere_sgemm_128x64_tn", "cuda", "cuda:0", 7, 100),
                           row(2, "kernel", "vectorized_elementwise_kernel", "cuda", "cuda:0", 7, 700),
                           row(3, "memcpy", "Memcpy HtoD (Pageable -> Device)", "cuda", "cuda:0", 7, 1300)])
    store.finish_run(rid, status="ok")
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    assert p["tracks"] == ["steps", "cuda:0 · stream 7", "torch:cpu"]
    group = dict(zip(p["names"], p["groups"]))
    assert group == {"ampere_sgemm_128x64_tn": "kernel", "vectorized_elementwise_kernel": "kernel",
                     "Memcpy HtoD (Pageable -> Device)": "memcpy", "linear": "linear", "step 0": "step"}
    # kernels are colored by their own name (an sgemm never looks like an elementwise kernel), and listed by it
    color, legend = dict(zip(p["names"], p["colors"])), dict(zip(p["names"], p["legend"]))
    assert color["ampere_sgemm_128x64_tn"] != color["vectorized_elementwise_kernel"]
    assert legend["ampere_sgemm_128x64_tn"] == "ampere_sgemm_128x64_tn" and legend["linear"] == "linear"


def test_a_runs_busiest_kernels_each_get_a_color_of_their_own(opscope_home):
    """A hash of kernel names onto a dozen colors collides (two of the busiest kernels looked alike): within a
    run, the busiest kernels take the kernel palette in turn, busiest first; the rest keep their hashed color."""
    store = RunStore()
    rid = store.create_run(model="m", backend="torch.profiler", device="cpu")
    n = len(theme._KERNELS) + 3
    # kernel k runs (k + 1) us: the busiest is the last one
    rows, t = [], 0
    for k in range(n):
        rows.append((0, k, "kernel", f"kernel_{k:02d}", "", "", "cuda", "cuda:0", 7, 0, t, t + (k + 1) * 1000,
                     "[]", "[]", "[]", "[]", 0, 0, False, 0))
        t += (k + 1) * 1000 + 10
    store.add_events(rid, rows)
    store.finish_run(rid, status="ok")
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    color = dict(zip(p["names"], p["colors"]))
    busiest = [f"kernel_{k:02d}" for k in reversed(range(n))]
    assert [color[k] for k in busiest[:len(theme._KERNELS)]] == theme._KERNELS          # distinct, in order
    assert all(color[k] == theme.span_color(k, "kernel") for k in busiest[len(theme._KERNELS):])


def test_python_stacks_get_their_own_tracks_and_frame_names(opscope_home):
    store = RunStore()
    rid = _run_with_events(store, n=10, status=None)
    store.add_stacks(rid, [(0, 5000, 1, 0, "train.py:12 main"), (0, 2500, 1, 1, "model.py:30 forward"),
                           (2500, 2500, 1, 1, "model.py:41 loss")])
    store.finish_run(rid, status="ok")
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=500").get_json()
    assert p["tracks"][-2:] == ["python stack 0", "python stack 1"]
    frames = [n for n, g in zip(p["names"], p["groups"]) if g == "python frame"]
    assert sorted(frames) == ["model.py:30 forward", "model.py:41 loss", "train.py:12 main"]
    assert all(i >= p["frames_from"] for i, g in enumerate(p["groups"]) if g == "python frame")
    assert {c for c, g in zip(p["colors"], p["groups"]) if g == "python frame"} == {theme.STACK}
    assert theme.STACK not in p["colors"][:p["frames_from"]]
    key0 = lod.unb64(p["spans"]["key0"], "f8")
    assert (key0 == lod.STACK_KEY).sum() == 3                       # every frame drawn, marked as a frame


def _run_with_events(store, n=20, description=None, status="ok"):
    rid = store.create_run(model="demo:mlp", backend="torch:cpu", device="cpu", description=description)
    rows = [(0, i, "linear" if i % 2 else "relu", f"n{i}", "fc", "m.py:3", "torch:cpu", "cpu", 1, 0,
             i * 1000, i * 1000 + 800, "[[8,16]]", '["float32"]', "[[8,16]]", '["float32"]', 4096, 8192, False,
             1000 + i) for i in range(n)]
    store.add_events(rid, rows)
    if status:
        store.finish_run(rid, status=status, error="boom" if status == "failed" else None)
    return rid


def test_op_table_without_a_peak_says_so(opscope_home):
    store = RunStore()
    rid = _run_with_events(store)
    data = WebData(store)
    rows = data.op_table(data.run(rid))
    assert {r["key"] for r in rows} == {"linear", "relu"}
    assert all(r["pct_peak"] is None for r in rows)
    from opscope.app.pages.operators import roofline
    fig = roofline(data.run(rid), data, rows)
    assert "no peak in description" in fig["layout"]["annotations"][0]["text"]


def test_op_table_with_a_peak_gives_percent_and_roofs(opscope_home):
    store = RunStore()
    rid = _run_with_events(store, description={"peak_flops": {"float32": 1e12}, "memory_bandwidth": 1e11})
    data = WebData(store)
    rows = data.op_table(data.run(rid))
    lin = next(r for r in rows if r["key"] == "linear")
    assert lin["pct_peak"] == pytest.approx(100 * lin["achieved_flops"] / 1e12)
    from opscope.app.pages.operators import roofline
    fig = roofline(data.run(rid), data, rows)
    assert any(t["name"] == "roof" for t in fig["data"])


def test_memory_series_of_a_long_run_keeps_every_spike_in_a_few_points(opscope_home):
    store = RunStore()
    n = 30_000
    rng = np.random.default_rng(1)
    live = rng.integers(1 << 20, 1 << 22, n)
    live[12_345] = 1 << 30                                       # one op's spike: the peak
    live[23_456] = 1                                             # and a dip
    rid = store.create_run(model="m", backend="torch:cpu", device="cpu")
    store.add_event_columns(rid, {
        "step": np.zeros(n, np.int64), "seq": np.arange(n), "op": np.full(n, "add", dtype=object),
        "node": np.full(n, "add", dtype=object), "module": np.full(n, "", dtype=object),
        "source": np.full(n, "", dtype=object), "backend": np.full(n, "torch:cpu", dtype=object),
        "device": np.full(n, "cpu", dtype=object), "thread": np.ones(n, np.int64), "depth": np.zeros(n, np.int64),
        "start_ns": np.arange(n) * 1000, "end_ns": np.arange(n) * 1000 + 900,
        "input_shapes": np.full(n, "[]", dtype=object), "input_dtypes": np.full(n, "[]", dtype=object),
        "output_shapes": np.full(n, "[]", dtype=object), "output_dtypes": np.full(n, "[]", dtype=object),
        "bytes": np.zeros(n, np.int64), "flops": np.zeros(n, np.int64), "fallback": np.zeros(n, bool),
        "live_bytes": live})
    store.finish_run(rid, status="ok")
    data = WebData(store)
    t, v = data.memory_series(rid, buckets=500)["torch:cpu"]
    assert len(t) <= 1000 and t == sorted(t)
    assert max(v) == 1 << 30 and t[v.index(1 << 30)] == 12_345 * 1000 + 900      # the peak, at its own time
    assert min(v) == 1
    t_all, v_all = data.memory_series(rid, buckets=n)["torch:cpu"]               # few enough: every sample
    assert len(t_all) == n and v_all == live.tolist()


def test_spans_cache_follows_a_streaming_run(opscope_home):
    store = RunStore()
    rid = _run_with_events(store, n=5, status=None)
    data = WebData(store)
    assert data.spans(data.run(rid)).count == 5
    store.add_events(rid, [(0, 99, "add", "n99", "", "", "torch:cpu", "cpu", 1, 0, 10**6, 10**6 + 5, "[]", "[]",
                            "[]", "[]", 0, 0, False, 0)])
    assert data.spans(data.run(rid)).count == 6


# --- the token gate -----------------------------------------------------------------------------

def test_token_refuses_requests_without_it(opscope_home):
    app = create_app(token="s3cret-token")
    c = app.server.test_client()
    assert c.get("/").status_code == 403
    assert c.get("/_dash-layout").status_code == 403
    assert c.get("/_opscope/timeline").status_code == 403              # the timeline's data, too
    assert c.get("/?token=wrong").status_code == 403
    assert c.get("/_dash-layout", headers={"X-Opscope-Token": "s3cret-token"}).status_code == 200
    assert c.get("/_dash-layout", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    r = c.get("/?token=s3cret-token")
    assert r.status_code == 200
    cookie = r.headers.get("Set-Cookie", "")
    assert cookie.startswith("opscope_token_80=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "s3cret-token" not in cookie                              # proof of the token for this port, not it
    assert c.get("/_dash-layout").status_code == 200                # the cookie carries it from now on


def test_an_app_made_without_a_token_has_no_gate(opscope_home):
    """create_app(token=None) is for a caller that serves it itself (tests); serve() always sets one (test_web_token)."""
    c = create_app().server.test_client()
    assert c.get("/").status_code == 200
    assert c.get("/_dash-layout").status_code == 200


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")
    assert not is_loopback("127.0.0.2")          # issue 24: only the three names count


def test_serve_off_loopback_generates_a_token_and_refuses_without_it(opscope_home, capsys, monkeypatch):
    """0.0.0.0 listens on every interface: serve() must turn the gate on; we knock through loopback."""
    monkeypatch.delenv("OPSCOPE_TOKEN", raising=False)               # else serve() takes that one
    srv, url = serve(host="0.0.0.0", port=0, block=False)
    try:
        err = capsys.readouterr()
        token = re.search(r"\?token=(\S+)", err.out).group(1)
        port = srv.server_port
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30)
        assert e.value.code == 403
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={token}", timeout=30) as r:
            assert r.status == 200
        assert f"token={token}" in err.out
    finally:
        srv.shutdown()


def test_cli_serve_rejects_a_bad_port(cli):
    r = cli("serve", "--port", "70000")
    assert r.returncode == 2
    assert "port" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_profile_web_ctrl_c_mid_run_stops_the_runner_and_keeps_the_run(opscope_home):
    """Ctrl-C in a terminal signals the whole group: no traceback, exit 130, the runner is stopped and the run
    kept as interrupted (not 'running', not 'failed: killed by SIGKILL'), with the steps whose events arrived
    (Ctrl-C lands right after the URL, so often none have yet)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "profile", "demo:gpt", "--backend", "sim:npu-a1",
                             "--steps", "500", "--web", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ctrl_c_able,
                            env=dict(os.environ, OPSCOPE_HOME=str(opscope_home)))
    try:
        first = proc.stdout.readline()
        rid = re.match(r"run (\w+):", first).group(1)
        assert re.search(r"web analyzer: http://127\.0\.0\.1:\d+/timeline\?run=\w+&token=[\w-]{40,}$",
                         proc.stdout.readline())         # the token is on by default (issue 24)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    run = RunStore().get_run(rid)
    assert run["status"] == "interrupted", (out, err)
    assert err.strip().startswith(f"opscope: interrupted: run {rid} stopped before it ended ({run['events']} events, "
                                  f"{run['steps']} step(s) kept"), err
    assert run["steps"] < 500, run
