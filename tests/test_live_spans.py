"""A live run's spans are appended as they arrive (issue 38, item 1): the server answers "since N" with only the
spans stored after the first N, and the spans it appends are the ones a fresh read of the store builds."""
import time

import pytest

from opscope.profiler import RunStore


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_live_answer_since_n_holds_only_the_new_spans():
    from opscope.app.web.data import WebData
    from opscope.app.web.server import create_app
    from opscope.profiler.live import start_profile

    store = RunStore()
    # runs until stopped below: 120 steps ended before the second ask on a quiet machine (the test's asks are slower)
    live = start_profile("demo:mlp", "numpy", steps=100_000, store=store, hardware=False)
    try:
        client = create_app(store=store, live=live).server.test_client()
        data = WebData(store, live)

        def answer(since):
            r = client.get(f"/_opscope/live_spans?run={live.run_id}&since={since}")
            assert r.status_code == 200
            return r.get_json()

        first, appended = None, 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and live.poll() == "running":
            doc = answer(0)
            if first is None and doc["total"] > 0:
                first = doc
            elif first is not None and doc["total"] > first["total"]:
                n = first["total"]
                new = answer(n)
                # only what arrived after the first n, in the order it arrived; the first n are the page's already
                assert new["since"] == n and new["total"] >= doc["total"]
                assert len(new["start"]) == new["total"] - n > 0
                whole = answer(0)
                assert whole["start"][:n] == first["start"] and whole["name"][:n] == first["name"]
                assert whole["start"][n:n + len(new["start"])] == new["start"]
                # the kept rows grew by the new events only (from the collector's memory, ahead of the store), and
                # hold what a full read of the store holds: the first so many to arrive, each with the same times
                run = data.run(live.run_id)
                kept = data._rows(run)
                if run["status"] == "running":
                    appended += 1
                fresh = WebData(store)._full_rows(run)
                ours, theirs = ({(s, q): (a, b) for s, q, a, b in zip(*(x["cols"][k].tolist() for k in (
                    "step", "seq", "start_ns", "end_ns")))} for x in (kept, fresh))
                fewer, more = sorted((ours, theirs), key=len)       # either may have more by now
                assert all(more.get(k) == v for k, v in fewer.items())
                first = whole
                if appended >= 3:
                    break
            time.sleep(0.05)
        assert appended >= 1, "the run ended before the server was asked twice while it ran"
        assert answer(10**9)["start"] == []
        assert client.get(f"/_opscope/live_spans?run={live.run_id}&since=-1").status_code == 400
        assert client.get(f"/_opscope/live_spans?run={live.run_id}&since=x").status_code == 400
    finally:
        live.kill()


@pytest.mark.browser
@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_timeline_gains_a_live_runs_spans_without_reloading_or_asking_for_the_whole_run(tmp_path):
    import shutil
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from opscope.app.web.browser import headless_chromium
    from opscope.app.web.server import create_app, start_in_thread
    from opscope.profiler.live import start_profile

    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=100_000, store=store, hardware=False)   # stopped below
    driver = headless_chromium(str(tmp_path / "chrome"))
    srv = None
    try:
        srv, url = start_in_thread(create_app(store=store, live=live))
        driver.get(f"{url}/timeline?run={live.run_id}")
        state = "return window.opscopeTimeline && window.opscopeTimeline.state();"
        deadline = time.monotonic() + 180
        while not ((s := driver.execute_script(state)) and s["spans"] and s["live"]):
            assert time.monotonic() < deadline and live.poll() == "running", s
            time.sleep(0.1)
        names = """var t = window.opscopeTimeline, out = [];
            t.tracks().forEach(function (k) { if (k !== 'steps') t.namesOn(k).forEach(function (n) { out.push(n); }); });
            return out;"""
        from opscope.app.web.data import WebData

        def stored_names():
            fresh = WebData(store).spans(store.get_run(live.run_id))
            return {fresh.names[fresh.label[i]] for k in range(len(fresh.tracks)) if fresh.tracks[k] != "steps"
                    for i in range(fresh.offsets[k], fresh.offsets[k + 1])}
        # a live answer with an op name the page's window lacks asks for a new window (its legend): by design, so
        # the page is counted from once its window holds every name stored so far and nothing is in flight
        while s["busy"] or not stored_names() <= set(driver.execute_script(names)):
            assert time.monotonic() < deadline and live.poll() == "running", s
            time.sleep(0.1)
            s = driver.execute_script(state)
        driver.execute_script("window.__samePage = true;")       # gone if the page reloads
        first = s
        while (s := driver.execute_script(state))["appended"] < 50:
            assert time.monotonic() < deadline and live.poll() == "running", s
            time.sleep(0.1)
        # spans were appended to the canvas from /_opscope/live_spans: no window of the whole run asked again
        assert driver.execute_script("return window.__samePage === true;")
        assert s["spans"] >= first["spans"] + 50 and s["fetches"] == first["fetches"], (first, s)
        # each append wrote the vertices of its own spans only, not the whole run's again
        assert not s["gl"] or s["uploaded"] - first["uploaded"] == s["spans"] - first["spans"], (first, s)
        assert s["live"] and "appended live" in driver.execute_script(
            "return document.getElementById('timeline-info').textContent;")
        # what was appended lands on the lanes a fresh window draws, under the names it draws
        keys = driver.execute_script("""var t = window.opscopeTimeline, out = [];
            t.tracks().forEach(function (k) { t.namesOn(k).forEach(function (n) { out.push(k + '|' + n); }); });
            return out;""")
        fresh = WebData(store).spans(store.get_run(live.run_id))
        drawn = {f"{fresh.tracks[k]}|{fresh.names[fresh.label[i]]}" for k in range(len(fresh.tracks))
                 for i in range(fresh.offsets[k], fresh.offsets[k + 1])}
        assert set(keys) <= drawn | {k for k in keys if k.startswith("steps|")}, set(keys) - drawn
    finally:
        live.kill()
        driver.quit()
        if srv:
            srv.shutdown()
