"""A live run's spans are appended as they arrive (issue 38, item 1): the server answers "since N" with only the
spans stored after the first N, and the spans it appends are the ones a fresh read of the store builds."""
import time

import numpy as np
import pytest

from opscope.profiler import RunStore


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_live_answer_since_n_holds_only_the_new_spans():
    from opscope.app.web.data import WebData
    from opscope.app.web.server import create_app
    from opscope.profiler.live import start_profile

    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=120, store=store, hardware=False)
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
                # the kept rows grew by reading only the new events, and equal a full read of the store
                run = data.run(live.run_id)
                kept = data._rows(run)
                if run["status"] == "running":
                    appended += 1
                fresh = WebData(store)._full_rows(run)
                m = min(len(fresh["cols"]["rowid"]), len(kept["cols"]["rowid"]))     # more may have come since
                ours, theirs = (np.argsort(x["cols"]["rowid"])[:m] for x in (kept, fresh))
                for k in ("start_ns", "end_ns", "step", "seq", "rowid"):
                    assert np.array_equal(kept["cols"][k][ours], fresh["cols"][k][theirs]), k
                first = whole
                if appended >= 3:
                    break
            time.sleep(0.05)
        assert appended >= 1, "the run ended before the server was asked twice while it ran"
        assert answer(10**9)["start"] == []
        assert client.get(f"/_opscope/live_spans?run={live.run_id}&since=-1").status_code == 400
        assert client.get(f"/_opscope/live_spans?run={live.run_id}&since=x").status_code == 400
    finally:
        live.wait(240)
