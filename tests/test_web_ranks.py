"""The Ranks page on a real 2-rank run (`opscope train --hybrid`: two processes over gloo): both ranks, their
compute / communication / idle per step, and the slow rank named -- by the page's callback, and in Chromium."""
import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.ranks import is_communication
from opscope.profiler.store import RunStore

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
TIMEOUT = 90          # bounds a hang on a shared machine; not a speed check


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """A real 2-process hybrid training run (gloo), made with the CLI a user types."""
    home = tmp_path_factory.mktemp("ranks-home")
    r = subprocess.run([sys.executable, "-m", "opscope.app", "train", "demo:mlp", "--hybrid",
                        "torch:cpu=0.5,numpy=0.5", "--steps", "3", "--json"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OPSCOPE_HOME=str(home)))
    assert r.returncode == 0, r.stderr[-2000:]
    store = RunStore(home / "runs.duckdb")
    return store, json.loads(r.stdout)["run_id"]


def slowest_rank(store, run_id) -> int:
    """Worked out here from the events, apart from profiler/ranks.py: a collective ends when its last rank
    arrives, so per step the rank the others wait for spends the least time in collectives (the hybrid engine
    runs them one after another, never under compute); the slowest is the one the others waited for longest."""
    f = store.events_frame(run_id, columns=["rank", "step", "op", "start_ns", "end_ns"])
    waits = Counter()
    for rank, step, op, s, e in zip(*(list(f[c]) for c in ("rank", "step", "op", "start_ns", "end_ns"))):
        waits[(int(step), int(rank))] += (int(e) - int(s)) if is_communication(op) else 0
    steps = sorted({s for s, _ in waits})
    waited = Counter()          # per step the slow rank keeps the others waiting (their wait - its own)
    for s in steps:
        ranks = [r for s2, r in waits if s2 == s]
        slow = min(ranks, key=lambda r: waits[(s, r)])
        waited[slow] += max(waits[(s, r)] for r in ranks) - waits[(s, slow)]
    return waited.most_common(1)[0][0]


def text_of(tree) -> str:
    """The text a Dash component tree (as a callback answers it) shows."""
    if isinstance(tree, str):
        return tree
    if isinstance(tree, list):
        return "".join(text_of(t) for t in tree)
    if isinstance(tree, dict):
        return text_of(tree.get("props", {}).get("children")) if "props" in tree else ""
    return "" if tree is None else str(tree)


def find(tree, id_):
    """The component with this id in a Dash component tree."""
    if isinstance(tree, list):
        return next((f for f in (find(t, id_) for t in tree) if f is not None), None)
    if isinstance(tree, dict) and "props" in tree:
        return tree if tree["props"].get("id") == id_ else find(tree["props"].get("children"), id_)
    return None


def _callback(app, key_part, status):
    from test_web_security import _callback_body, _server_callbacks
    c = app.server.test_client()
    c.get("/")
    key, cb = next((k, cb) for k, cb in _server_callbacks(app).items() if key_part in k)
    r = c.post("/_dash-update-component", json=_callback_body(key, cb, [status]))
    assert r.status_code == 200, r.get_data(as_text=True)[-500:]
    return r.get_data(as_text=True)


def test_the_ranks_page_names_the_slow_rank_and_shows_both_ranks_per_step(two_ranks):
    store, rid = two_ranks
    body = _callback(create_app(store=store), "ranks-summary", {"run": rid, "status": "ok", "events": 1, "dropped": 0})
    resp = json.loads(body)["response"]
    slow = slowest_rank(store, rid)
    named = text_of(find(resp["ranks-summary"]["children"], "ranks-slowest"))
    assert named.startswith(f"Slowest rank: rank {slow} ({['torch:cpu', 'numpy'][slow]})"), named
    assert "world size 2" in body and "rank 0 (torch:cpu)" in body and "rank 1 (numpy)" in body
    assert "the others waited for it" in named and "waits least" not in named
    assert text_of(find(resp["ranks-summary"]["children"], "ranks-clock")).startswith("Clock: wall")
    assert "peak 1 B" not in body and "1 B" not in body    # per-rank memory: a real peak or unknown, never 1 B
    fig = find(resp["ranks-graph"]["children"], "ranks-breakdown")["props"]["figure"]
    filled = [t for t in fig["data"] if t.get("fill") == "toself"]
    assert [t["name"] for t in filled] == ["compute only", "compute + communication", "communication only", "idle"]
    assert fig["layout"]["xaxis"]["ticktext"] == [f"rank {r}<br>step {s}" for s in range(3) for r in range(2)]
    # stacked: each part starts where the one below ended; the collectives are there (communication > 0)
    tops = [[t["y"][i + 1] for i in range(0, len(t["y"]), 6)] for t in filled]
    bottoms = [[t["y"][i] for i in range(0, len(t["y"]), 6)] for t in filled]
    assert all(b == pytest.approx(t) for lower, upper in zip(tops, bottoms[1:]) for t, b in zip(lower, upper))
    assert all(top > bottom for top, bottom in zip(tops[2], bottoms[1]))


def test_a_one_rank_run_says_how_to_get_ranks(opscope_home):
    store = RunStore()
    from test_web_security import a_run
    rid = a_run(store)
    body = _callback(create_app(store=store), "ranks-summary", {"run": rid, "status": "ok", "events": 6,
                                                                 "dropped": 0})
    assert "This run has one rank" in body and "--hybrid" in body


@pytest.mark.browser
def test_in_a_browser_the_ranks_page_shows_both_ranks_and_names_the_slower(two_ranks, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from test_web_browser import until, wait_text

    from opscope.app.web.browser import headless_chromium
    store, rid = two_ranks
    slow = slowest_rank(store, rid)
    srv, url = start_in_thread(create_app(store=store))
    driver = headless_chromium(str(tmp_path / "chrome"))
    try:
        driver.get(f"{url}/ranks?run={rid}")
        wait_text(driver, "ranks-slowest", f"Slowest rank: rank {slow} (", timeout=TIMEOUT)
        table = driver.execute_script("return document.getElementById('ranks-table').innerText")
        assert "rank 0 (torch:cpu)" in table and "rank 1 (numpy)" in table
        # the stacked bars drew: the four parts filled, a tick per rank and step
        fills = until(driver, "return document.querySelectorAll('#ranks-breakdown .scatterlayer .js-fill').length",
                      timeout=TIMEOUT)
        assert fills == 4
        ticks = driver.execute_script("return [...document.querySelectorAll('#ranks-breakdown .xtick text')]"
                                      ".map(t => t.textContent)")
        assert ticks == [f"rank {r}step {s}" for s in range(3) for r in range(2)], ticks
        assert driver.execute_script("return !!document.querySelector('#nav a[href^=\"/ranks\"].active')")
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()


def _timeline_spans(payload) -> list[tuple[str, str]]:
    """(track label, span name) of every span the timeline endpoint drew."""
    from opscope.app.web.timeline import unb64
    tracks, labels = unb64(payload["spans"]["track"], "i4"), unb64(payload["spans"]["label"], "i4")
    return [(payload["tracks"][t], payload["names"][k]) for t, k in zip(tracks, labels)]


def test_the_timeline_shows_both_ranks_with_their_all_reduce_on_a_lane_each(two_ranks):
    """Issue 18: a 2-rank profile shows both ranks on the timeline with their all-reduce spans."""
    store, rid = two_ranks
    p = create_app(store=store).server.test_client().get(f"/_opscope/timeline?run={rid}&px=1400").get_json()
    ops = [t for t in p["tracks"] if t.startswith("rank ")]
    assert ops == ["rank 0 · torch:cpu", "rank 0 · communication", "rank 1 · numpy", "rank 1 · communication"]
    drawn = _timeline_spans(p)
    assert p["buckets"]["n"] == 0                                   # every op drawn as itself, none in buckets
    f = store.events_frame(rid, columns=["rank", "op"])
    for rank in (0, 1):
        on_comm = [n for t, n in drawn if t == f"rank {rank} · communication"]
        want = sorted(str(op) for r, op in zip(f["rank"], f["op"]) if int(r) == rank and is_communication(str(op)))
        assert sorted(on_comm) == want and on_comm.count("all_reduce") == 3        # one all-reduce per step
        compute = {n for t, n in drawn if t.startswith(f"rank {rank} · ") and "communication" not in t}
        assert compute and not any(is_communication(n) for n in compute)


@pytest.mark.browser
def test_in_a_browser_the_timeline_labels_both_ranks(two_ranks, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from test_web_browser import until

    from opscope.app.web.browser import headless_chromium
    store, rid = two_ranks
    srv, url = start_in_thread(create_app(store=store))
    driver = headless_chromium(str(tmp_path / "chrome"))
    try:
        driver.get(f"{url}/timeline?run={rid}")
        tracks = until(driver, "var t = window.opscopeTimeline && window.opscopeTimeline.tracks();"
                               "return t && t.length ? t : null;", timeout=TIMEOUT)
        assert [t for t in tracks if t.startswith("rank ")] == [
            "rank 0 · torch:cpu", "rank 0 · communication", "rank 1 · numpy", "rank 1 · communication"]
        for rank in (0, 1):
            names = driver.execute_script("return window.opscopeTimeline.namesOn(arguments[0]);",
                                          f"rank {rank} · communication")
            assert "all_reduce" in names, names
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()
