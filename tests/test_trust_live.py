"""The live timeline keeps drawing while a run streams in even when the server answers slower than the header's
poll (issue 27: timeline median 3.2 s behind, p95 12.7 s). Each new event count used to abort the timeline's
fetch in flight; with every fetch outliving the 1 s poll, nothing new was drawn until the run ended."""
import re
import shutil
import threading
import time

import numpy as np
import pytest

from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.store import RunStore

pytestmark = [pytest.mark.browser, pytest.mark.slow]

INFO = "var e = document.getElementById('timeline-info'); return e ? e.textContent : '';"
SLOWER_THAN_THE_POLL_S = 1.6          # the header polls every second


class Live:
    """What the web app reads of a LiveRun: its id, status and the collector's counters."""

    def __init__(self, run_id):
        self.run_id, self.events_received, self.dropped, self.status = run_id, 0, 0, "running"

    def poll(self):
        return self.status


def _write(store, rid, lo, n=200):
    start = (lo + np.arange(n)) * 1000
    s = lambda v: np.full(n, v, dtype=object)   # noqa: E731
    store.add_event_columns(rid, {
        "step": np.zeros(n, np.int64), "seq": lo + np.arange(n), "op": s("linear"), "node": s("linear"),
        "module": s(""), "source": s(""), "backend": s("torch:cpu"), "device": s("cpu"), "thread": np.ones(n, np.int64),
        "depth": np.zeros(n, np.int64), "start_ns": start, "end_ns": start + 800, "input_shapes": s("[]"),
        "input_dtypes": s("[]"), "output_shapes": s("[]"), "output_dtypes": s("[]"), "bytes": np.zeros(n, np.int64),
        "flops": np.zeros(n, np.int64), "fallback": np.zeros(n, bool), "live_bytes": np.zeros(n, np.int64)})


def test_the_timeline_draws_new_events_while_its_fetches_outlive_the_poll(opscope_home, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from opscope.app.web.browser import headless_chromium
    store = RunStore()
    rid = store.create_run(model="m", backend="torch:cpu", device="cpu")
    live = Live(rid)
    _write(store, rid, 0)
    live.events_received = 200
    app = create_app(store=store, live=live)
    data, spans = app.opscope_data, app.opscope_data.spans

    def slow_spans(*a, **k):              # a busy server: every timeline answer takes longer than a poll
        time.sleep(SLOWER_THAN_THE_POLL_S)
        return spans(*a, **k)
    data.spans = slow_spans
    stop = threading.Event()

    def collector():
        while not stop.wait(0.4):
            _write(store, rid, live.events_received)
            live.events_received += 200
    srv, url = start_in_thread(app)
    driver = headless_chromium(str(tmp_path / "chrome"))
    writer = threading.Thread(target=collector, daemon=True)
    try:
        driver.get(f"{url}/timeline?run={rid}")
        until = time.time() + 120
        while "of 200 spans" not in driver.execute_script(INFO):       # the first window, before the stream
            assert time.time() < until, driver.execute_script(INFO)
            time.sleep(0.1)
        writer.start()
        drawn, t_end = set(), time.time() + 150     # ends at the third drawn count (seconds on an idle machine)
        while time.time() < t_end and len(drawn) < 3:
            m = re.search(r"of ([\d,]+) spans", driver.execute_script(INFO))
            if m and int(m.group(1).replace(",", "")) > 200:
                drawn.add(int(m.group(1).replace(",", "")))
            time.sleep(0.1)
        # new counts were drawn while the run was still streaming (before: none until it stopped)
        assert len(drawn) >= 3, (drawn, live.events_received)
        assert max(drawn) <= live.events_received
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        driver.quit()
        srv.shutdown()
