"""The web analyzer in headless Chromium (Debian's chromium + chromedriver), on real runs.

Each test opens pages the way a user does (a real click on a span, a table row, the Compare dropdown)
and ends by checking that the browser console holds no error.
"""
import shutil
import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not (shutil.which("chromium") or shutil.which("/usr/bin/chromium")) or not shutil.which("chromedriver"):
    pytest.skip("needs chromium and chromedriver", allow_module_level=True)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By                     # noqa: E402

from opscope.app.cli.common import fmt_ratio                     # noqa: E402
from opscope.app.web import components as ui                     # noqa: E402
from opscope.app.web.browser import headless_chromium            # noqa: E402
from opscope.app.web.server import create_app, start_in_thread  # noqa: E402
from opscope.profiler import profile                            # noqa: E402
from opscope.profiler.store import RunStore                     # noqa: E402
from opscope.runtime.models import load                         # noqa: E402

from conftest import ctrl_c_able                                # noqa: E402

TIMEOUT = 90          # the test machine is shared; this bounds a hang, it is not a speed check
TOKEN = "browser-test-token"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # In-process profiles (model objects given): the same recorder and store as the runner, one process less.
    store = RunStore(tmp_path_factory.mktemp("web-store") / "runs.duckdb")
    model, inputs = load("demo:gpt")
    store.npu = profile("demo:gpt", "sim:npu-a1", steps=1, values=True, store=store, model=model, inputs=inputs)
    store.cpu = profile("demo:gpt", "torch:cpu", steps=1, values=True, store=store, model=model, inputs=inputs)
    return store


@pytest.fixture(scope="module")
def server(store, driver):
    """A server that needs a token, as `opscope serve` does: the driver opens ?token= once, then every page and
    every fetch of theirs passes by the cookie."""
    srv, url = start_in_thread(create_app(store=store, token=TOKEN))
    driver.get(f"{url}/?token={TOKEN}")
    yield url
    srv.shutdown()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = headless_chromium(str(tmp_path_factory.mktemp("chrome")))
    d.set_window_size(1500, 1000)
    yield d
    d.quit()


@pytest.fixture
def browser(driver):
    """The driver; after the test, the console must hold no error (SEVERE)."""
    driver.get_log("browser")
    yield driver
    severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe


def until(driver, script, *args, timeout=TIMEOUT):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = driver.execute_script(script, *args)
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {script[:200]}")


def text_of(driver, id_):
    return driver.execute_script("var e = document.getElementById(arguments[0]); return e ? e.innerText : '';", id_)


def wait_text(driver, id_, needle, timeout=TIMEOUT):
    return until(driver, "var e = document.getElementById(arguments[0]);"
                         "return !!(e && e.innerText.indexOf(arguments[1]) >= 0);", id_, needle, timeout=timeout)


TIMELINE_DRAWN = """var s = window.opscopeTimeline && window.opscopeTimeline.state();
return !!(s && s.draws > 0 && s.spans + s.buckets > 0 && !s.busy);"""
TIMELINE = "return window.opscopeTimeline.state();"
ROWS = "return document.querySelectorAll('#' + arguments[0] + ' .ag-row .ag-cell').length > 0;"
GRAPH = """var gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
return !!(gd && gd.data && gd.data.length);"""


def test_every_page_renders_on_a_real_run(browser, server, store):
    checks = {
        "/": (ROWS, "runs-table"), f"/timeline?run={store.npu}": (TIMELINE_DRAWN,),
        f"/operators?run={store.npu}": (GRAPH, "ops-roofline"), f"/memory?run={store.npu}": (GRAPH, "memory-graph"),
        f"/compare?run={store.cpu}&b={store.npu}": (ROWS, "compare-table"),
        f"/tensors?run={store.npu}": (ROWS, "tensors-table"),
    }
    for path, (script, *args) in checks.items():
        browser.get(server + path)
        until(browser, script, *args)
        wait_text(browser, "run-badge", "events")
    browser.get(f"{server}/operators?run={store.npu}")
    until(browser, ROWS, "ops-table")
    browser.get(f"{server}/hardware?run={store.cpu}")
    until(browser, "var e = document.getElementById('hardware-graph');"
                   "return !!(e && (e.querySelector('.js-plotly-plot') || e.innerText.indexOf('not available') >= 0));")
    browser.get(f"{server}/advisor?run={store.npu}")
    until(browser, "return document.querySelectorAll('#advisor-list .card').length > 0;")


def test_timeline_draws_with_webgl_and_loads_plotly_only_after(browser, server, store):
    browser.get(f"{server}/timeline?run={store.npu}")
    until(browser, TIMELINE_DRAWN)
    assert browser.execute_script(TIMELINE)["gl"]                       # WebGL, not the 2D fallback
    wait_text(browser, "timeline-info", "spans in view")
    # plotly.js (for the other pages) starts only once the timeline has drawn, and then does load
    until(browser, "return !!(window.Plotly && window.Plotly.newPlot);")
    legend = browser.execute_script("return document.querySelector('#timeline-graph .tl-legend').innerText;")
    assert "transfer" in legend and "too small to draw" in legend            # the ops drawn, and the buckets


def test_compare_draws_without_plotly_and_a_page_reached_from_it_loads_plotly_for_its_graph(browser, server, store):
    """plotly.js starts with the page only where the page draws with it (server._EARLY): Compare draws its ratios
    in HTML and never loads it; a graph on the next page (a link, no reload) loads it then."""
    browser.get(f"{server}/compare?run={store.cpu}&b={store.npu}")
    until(browser, ROWS, "compare-table")
    until(browser, "return document.querySelectorAll('#compare-graph .ratio-dot').length > 0;")
    assert browser.execute_script("return !(window.Plotly && window.Plotly.newPlot) && "
                                  "!document.querySelector('script[src*=\"plotly\"]');")
    browser.find_element(By.CSS_SELECTOR, "#nav a[href^='/operators']").click()
    until(browser, "return !!(window.Plotly && window.Plotly.newPlot && "
                   "document.querySelector('#ops-roofline .js-plotly-plot'));")


def _hover_at(driver, x, y):
    """A real mouse move to client coordinates (x, y), through the element under that point."""
    el = driver.execute_script("return document.elementFromPoint(arguments[0], arguments[1]);", x, y)
    r = driver.execute_script("var r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];", el)
    ActionChains(driver).move_to_element_with_offset(el, x - r[0] - r[2] / 2, y - r[1] - r[3] / 2).pause(0.2).perform()


def test_click_a_span_shows_its_details(browser, server, store):
    browser.get(f"{server}/timeline?run={store.npu}")
    until(browser, TIMELINE_DRAWN)
    wide = browser.execute_script("return window.opscopeTimeline.widestSpanPoint();")
    _hover_at(browser, wide["x"], wide["y"])
    tip = browser.execute_script("var t = document.querySelector('.tl-tip'); return [t.style.display, t.innerText];")
    assert tip[0] == "block" and f"#{int(wide['key1'])}" in tip[1]      # hovering names the span
    ActionChains(browser).click().perform()
    wait_text(browser, "timeline-details", "module path")
    details = text_of(browser, "timeline-details")
    for field in ("node", "input shapes", "output dtypes", "FLOPs", "source line"):
        assert field in details
    assert f"{int(wide['key0'])} · {int(wide['key1'])}" in details        # step · seq of the span clicked


def test_wasd_zooms_and_the_server_redraws(browser, server, store):
    browser.get(f"{server}/timeline?run={store.npu}")
    until(browser, TIMELINE_DRAWN)
    wait_text(browser, "timeline-info", "spans in view")
    before = browser.execute_script(TIMELINE)
    body = browser.find_element(By.TAG_NAME, "body")
    for _ in range(6):
        body.send_keys("w")
    after = until(browser, "var s = window.opscopeTimeline.state();"
                           "return s.shown && !s.busy && s.shown[1] - s.shown[0] < (arguments[0] - arguments[1]) / 2 && s;",
                  before["t1"], before["t0"])
    assert after["fetches"] > before["fetches"]                          # the server sent the new window's detail
    body.send_keys("d")
    until(browser, "var s = window.opscopeTimeline.state(); return s.shown && !s.busy && s.shown[0] > arguments[0];",
          after["shown"][0])


def _pick_option(driver, dropdown_id, label):
    driver.find_element(By.ID, dropdown_id).click()
    until(driver, """var opts = document.querySelectorAll('[role=option]');
        for (var i = 0; i < opts.length; i++) if (opts[i].innerText.trim() === arguments[0]) return opts[i];""",
          label).click()


def test_the_step_dropdown_shows_that_step_and_back(browser, server, store):
    from opscope.app.web.data import WebData
    model, inputs = load("demo:mlp")
    rid = profile("demo:mlp", "numpy", steps=3, store=store, model=model, inputs=inputs)
    windows = WebData(store).step_windows(rid)
    first = min(a for _, a, _ in windows)
    browser.get(f"{server}/timeline?run={rid}")
    until(browser, TIMELINE_DRAWN)
    whole = browser.execute_script(TIMELINE)["shown"]
    _pick_option(browser, "timeline-step", "step 1")
    shown = until(browser, "var s = window.opscopeTimeline.state();"
                           "return s.shown && !s.busy && s.shown[1] - s.shown[0] < arguments[0] && s.shown;",
                  whole[1] - whole[0])
    _, a1, b1 = windows[1]
    assert shown == [a1 - first, b1 - first]                     # exactly step 1's window, in ns since the run's start
    _pick_option(browser, "timeline-step", "all steps")
    until(browser, "var s = window.opscopeTimeline.state(); return s.shown && !s.busy && s.shown[0] === arguments[0]"
                   " && s.shown[1] === arguments[1];", *whole)


def test_drag_zooms_to_the_range_and_double_click_shows_the_whole_run(browser, server, store):
    browser.get(f"{server}/timeline?run={store.npu}")
    until(browser, TIMELINE_DRAWN)
    whole = browser.execute_script(TIMELINE)
    over = browser.find_element(By.CSS_SELECTOR, "#timeline-graph .tl-over")
    r = over.rect
    # from 40% to 60% of the plot (the plot starts 170 px in, after the track labels)
    x0, x1 = 170 + 0.4 * (r["width"] - 182), 170 + 0.6 * (r["width"] - 182)
    ActionChains(browser).move_to_element_with_offset(over, x0 - r["width"] / 2, 12 - r["height"] / 2) \
        .click_and_hold().move_by_offset((x1 - x0) / 2, 0).move_by_offset((x1 - x0) / 2, 0).release().perform()
    zoomed = until(browser, "var s = window.opscopeTimeline.state(); return s.shown && !s.busy && "
                            "s.shown[1] - s.shown[0] < 0.3 * (arguments[0] - arguments[1]) && s;", whole["t1"], whole["t0"])
    width = whole["t1"] - whole["t0"]
    assert abs(zoomed["t0"] - (whole["t0"] + 0.4 * width)) < 0.02 * width
    ActionChains(browser).double_click(over).perform()
    until(browser, "var s = window.opscopeTimeline.state(); return s.shown && !s.busy && "
                   "s.shown[1] - s.shown[0] >= 0.99 * (arguments[0] - arguments[1]);", whole["t1"], whole["t0"])


def test_with_a_token_the_timeline_fetches_its_data_through_the_cookie(browser, store):
    """?token= once: the page's own fetches (the timeline's windows) then pass the gate by the cookie."""
    srv, url = start_in_thread(create_app(store=store, token="t0ken-for-the-test"))
    try:
        browser.get(f"{url}/timeline?run={store.npu}&token=t0ken-for-the-test")
        until(browser, TIMELINE_DRAWN)
        wait_text(browser, "timeline-info", "spans in view")
        before = browser.execute_script(TIMELINE)
        browser.find_element(By.TAG_NAME, "body").send_keys("w")
        # a window is only 'shown' once the server's answer for it came back and was drawn
        until(browser, "var s = window.opscopeTimeline.state();"
                       "return s.fetches > 0 && !s.busy && s.shown[1] - s.shown[0] < arguments[0];",
              before["shown"][1] - before["shown"][0])
    finally:
        srv.shutdown()


def test_click_an_operator_row(browser, server, store):
    browser.get(f"{server}/operators?run={store.npu}")
    until(browser, ROWS, "ops-table")
    browser.find_elements(By.CSS_SELECTOR, "#ops-table .ag-row .ag-cell")[0].click()
    wait_text(browser, "ops-detail", "calls")
    assert "arithmetic intensity" in text_of(browser, "ops-detail")


def test_find_an_op_from_its_row_then_walk_its_calls_on_the_timeline(browser, server, store):
    """Operators row -> 'Find every <op> on the timeline' -> the search marks its calls; Enter goes to each in turn."""
    from selenium.webdriver.common.keys import Keys
    browser.get(f"{server}/operators?run={store.npu}")
    until(browser, ROWS, "ops-table")
    cell = until(browser, """var cells = document.querySelectorAll('#ops-table .ag-row .ag-cell[col-id=name]');
        for (var i = 0; i < cells.length; i++) if (cells[i].innerText.trim() === 'linear') return cells[i];""")
    cell.click()
    until(browser, "return document.getElementById('ops-find');").click()
    until(browser, "var s = window.opscopeTimeline && window.opscopeTimeline.state();"
                   "return !!(s && s.find === 'linear' && s.draws && !s.busy);")
    assert browser.find_element(By.ID, "timeline-find").get_attribute("value") == "linear"
    wait_text(browser, "timeline-info", "matches for 'linear'")
    box = browser.find_element(By.ID, "timeline-find")
    seen = []
    for _ in range(3):
        box.send_keys(Keys.ENTER)
        mark = until(browser, "var s = window.opscopeTimeline.state(); return s.mark && !s.busy &&"
                              "(!arguments[0] || s.mark.key[1] !== arguments[0][1]) && s.mark;", seen[-1] if seen else None)
        assert mark["start"] >= browser.execute_script(TIMELINE)["t0"]           # the view holds the match
        wait_text(browser, "timeline-details", f"{int(mark['key'][0])} · {int(mark['key'][1])}")
        assert "linear" in text_of(browser, "timeline-details")
        seen.append(mark["key"])
    assert [k[1] for k in seen] == sorted(k[1] for k in seen)                      # forward, call after call


def test_in_window_lists_what_the_view_holds_and_a_row_searches_for_it(browser, server, store):
    browser.get(f"{server}/timeline?run={store.npu}")
    until(browser, TIMELINE_DRAWN)
    rows = until(browser, "var r = document.querySelectorAll('#timeline-graph .tl-summary tr[data-name]');"
                          "return r.length ? Array.prototype.map.call(r, function (x) { return x.getAttribute('data-name'); }) : null;")
    assert "gelu" in rows                                          # demo:gpt's fallback op holds the most time
    browser.find_element(By.CSS_SELECTOR, f"#timeline-graph .tl-summary tr[data-name='{rows[1]}']").click()
    until(browser, "var s = window.opscopeTimeline.state(); return s.find === arguments[0] && !s.busy;", rows[1])
    assert browser.find_element(By.ID, "timeline-find").get_attribute("value") == rows[1]


def test_click_a_tensor_row_shows_its_steps_and_histogram(browser, server, store):
    browser.get(f"{server}/tensors?run={store.npu}")
    until(browser, ROWS, "tensors-table")
    cell = browser.find_elements(By.CSS_SELECTOR, "#tensors-table .ag-row[row-index='1'] .ag-cell[col-id=node]")[0]
    node = cell.text
    cell.click()
    until(browser, GRAPH, "tensors-hist")
    until(browser, GRAPH, "tensors-stats")
    title = browser.execute_script("return document.querySelector('#tensors-stats .js-plotly-plot').layout.xaxis.title.text;")
    assert node and node in title                                         # the steps of the row clicked


def test_compare_switches_runs(browser, server, store):
    browser.get(f"{server}/compare?run={store.cpu}&b={store.npu}")
    wait_text(browser, "compare-summary", store.npu[:12])
    until(browser, ROWS, "compare-table")
    # run B becomes the CPU run too: every ratio must then be exactly 1
    browser.find_element(By.ID, "compare-b").click()
    option = until(browser, """var opts = document.querySelectorAll('[role=option]');
        for (var i = 0; i < opts.length; i++) { var inp = opts[i].querySelector('input');
          if (inp && inp.value === arguments[0]) return opts[i]; } return null;""", store.cpu)
    option.click()
    # wait for run B to be gone from the summary (the two runs' ratio alone may happen to read 1.00x too)
    until(browser, "return document.getElementById('compare-summary').innerText.indexOf(arguments[0]) < 0;",
          store.npu[:12])
    summary = text_of(browser, "compare-summary")
    assert summary.count(store.cpu[:12]) == 2 and "1.00x" in summary
    cells = until(browser, "var c = [...document.querySelectorAll('#compare-table .ag-cell[col-id=ratio]')]"
                           ".map(e => e.innerText); return c.length ? c : null;")
    assert {c for c in cells if c} == {"1.00x"}, cells
    # the table's ratios in the CLI's adaptive format: a tiny ratio keeps its digits, never "0.00x"
    values = [0.0042, 1.5, 0.01, 1.234e-05, 0.0, 250.0, -0.003]
    assert browser.execute_script("return arguments[0].map(v => window.dashAgGridFunctions.ratio(v));",
                                  values) == [fmt_ratio(v) for v in values]
    # durations: the tables (JS) and the panels written on the server (Python) read the same
    ns = [820_000, 56_240_000, 4e9, 999_960, 999.6, 12, 0, 123_456, 1.5e12, -5000, 999.6e9]
    assert browser.execute_script("return arguments[0].map(v => window.dashAgGridFunctions.duration(v));",
                                  ns) == [ui.fmt_ns(v) for v in ns]
    # the address follows the picked runs: copied from the bar, it opens this comparison
    until(browser, "return location.search.indexOf('b=' + arguments[0]) >= 0;", store.cpu)
    assert f"run={store.cpu}" in browser.execute_script("return location.search;")
    # one side simulated (NPU), the other measured: the totals say they are not the same kind of number
    browser.get(f"{server}/compare?run={store.cpu}&b={store.npu}")
    wait_text(browser, "compare-summary", "simulated clock")
    assert "run B ran on a simulated clock" in text_of(browser, "compare-summary")


def test_runs_page_picks_two_runs_to_compare(browser, server, store):
    browser.get(server + "/")
    until(browser, ROWS, "runs-table")
    wait_text(browser, "runs-actions", "Click a run")
    assert "No runs yet" not in text_of(browser, "runs-actions")        # not under a table of runs
    second = browser.find_elements(By.CSS_SELECTOR, "#runs-table .ag-row[row-index='1'] .ag-cell[col-id=run_id]")[0]
    picked = second.text
    second.click()                                                       # a row's click shows that run's pages
    until(browser, "var e = document.querySelector('#runs-actions .picked');"
                   "return !!(e && e.innerText.indexOf(arguments[0]) >= 0);", picked)
    until(browser, ROWS, "runs-steps-table")                            # its steps: count, per step, slowest
    assert "slowest: step" in text_of(browser, "runs-steps")
    boxes = browser.find_elements(By.CSS_SELECTOR, "#runs-table .ag-row input[type=checkbox]")
    assert len(boxes) >= 2
    boxes[0].click()
    boxes[1].click()
    until(browser, "return !!document.getElementById('compare-link');")
    browser.find_element(By.ID, "compare-link").click()
    until(browser, ROWS, "compare-table")


def _event(seq, t):
    return (0, seq, "linear", f"linear_{seq}", "h.0.mlp", "gpt.py:30", "torch:cpu", "cpu", 1, 0, t, t + 5000,
            "[[2,128,256]]", '["float32"]', "[[2,128,256]]", '["float32"]', 1 << 20, 1 << 24, False, 1 << 20)


def test_a_running_run_updates_live_and_a_failed_run_shows_its_error(browser, server, store):
    rid = store.create_run(model="demo:gpt", backend="torch:cpu", device="cpu")
    store.add_events(rid, [_event(i, i * 10_000) for i in range(10)])
    browser.get(f"{server}/timeline?run={rid}")
    until(browser, TIMELINE_DRAWN)
    wait_text(browser, "run-badge", "running")
    wait_text(browser, "run-badge", "10 events")
    wait_text(browser, "timeline-info", "of 10 spans")
    store.add_events(rid, [_event(i, i * 10_000) for i in range(10, 25)])        # more arrive: no reload
    wait_text(browser, "run-badge", "25 events")
    wait_text(browser, "timeline-info", "of 25 spans")
    store.finish_run(rid, status="ok", dropped=3)
    wait_text(browser, "run-badge", "3 dropped")
    assert "ok" in text_of(browser, "run-badge")

    bad = store.create_run(model="demo:gpt", backend="sim:edge-gpu", device="gpu")
    store.add_events(bad, [_event(i, i * 10_000) for i in range(4)])
    store.finish_run(bad, status="failed", error="OpFailed: gelu raised FloatingPointError")
    for page in ("timeline", "operators", "memory"):
        browser.get(f"{server}/{page}?run={bad}")
        wait_text(browser, "run-badge", "failed")
        wait_text(browser, "run-badge", "FloatingPointError")
    until(browser, GRAPH, "memory-graph")


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_profile_web_streams_the_run_live_then_keeps_serving(browser, opscope_home):
    """The README's command, for real: runner + server, the page follows the run from running to ok."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading

    import psutil

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "profile", "demo:gpt", "--backend", "sim:npu-a1",
                             "--steps", "20", "--web", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_able,
                            env=dict(os.environ, OPSCOPE_HOME=str(opscope_home)))
    # On a loaded machine the 20 steps could end before the page first loads, and there would be no
    # growth to watch: the runner is held (SIGSTOP) from its start until the page shows the run.
    runner = None
    while runner is None and proc.poll() is None:
        runner = next((c for c in psutil.Process(proc.pid).children()
                       if "opscope.profiler.runner" in " ".join(c.cmdline())), None)
    assert runner is not None, proc.stderr.read()
    runner.suspend()
    lines, url = [], None
    try:
        t0 = time.time()
        while url is None and time.time() - t0 < TIMEOUT:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"web analyzer: (http://\S+)", line)
            url = m.group(1) if m else None
        assert url and f":{port}/timeline?run=" in url, lines
        rest = []
        reader = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
        reader.start()
        browser.get(url)
        wait_text(browser, "run-badge", "running", timeout=TIMEOUT)
        counts = [int(re.search(r"([\d,]+) events", text_of(browser, "run-badge")).group(1).replace(",", ""))]
        runner.resume()
        until(browser, TIMELINE_DRAWN)
        while "ok" not in text_of(browser, "run-badge").split("\n"):      # the badge follows the run
            counts.append(int(re.search(r"([\d,]+) events", text_of(browser, "run-badge")).group(1).replace(",", "")))
            assert proc.poll() is None, lines
            assert time.time() - t0 < 4 * TIMEOUT, counts
            time.sleep(0.3)
        final = int(re.search(r"([\d,]+) events", text_of(browser, "run-badge")).group(1).replace(",", ""))
        assert counts and final > min(counts) and final >= 20 * 80, (counts, final)   # it grew while we watched
        wait_text(browser, "timeline-info", f"of {final:,} spans")          # the timeline caught up, no reload
        assert proc.poll() is None                                          # still serving after the run ended
        time.sleep(1.0)
        assert any("still serving" in x for x in rest), rest
        browser.get(url.replace("/timeline", "/operators"))
        until(browser, ROWS, "ops-table")
    finally:
        browser.get("about:blank")         # no request of the page's in flight when the server goes
        if runner.is_running():
            runner.resume()
        proc.send_signal(signal.SIGINT)                                     # Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    err = proc.stderr.read()
    assert proc.returncode == 130, err              # Ctrl-C, after the run ended too (issue 34)
    assert "Traceback" not in err, err


def test_every_page_shows_a_server_error_as_one_line_never_loading(driver, store, monkeypatch):
    """A run whose stored description lacks `implementation` made the Advisor raise, and the page said
    'loading…' for ever. Now each page, its server failing, says what failed in one line where it would draw."""
    rid = store.create_run(model="demo:mlp", backend="npu-x", device="sim:npu-x",
                           description={"name": "npu-x", "peak_flops": {"float32": 1e12}})   # no implementation
    store.add_events(rid, [_event(i, i * 10_000) for i in range(5)])
    store.finish_run(rid, status="ok")
    app = create_app(store=store)
    data = app.opscope_data

    def boom(*a, **k):
        raise RuntimeError("boom: the store cannot be read")
    for name in ("times", "op_table", "memory_series", "tensor_rows", "hardware", "spans"):
        setattr(data, name, boom)
    monkeypatch.setattr(store, "op_stats", boom)          # Compare's per-op table
    srv, url = start_in_thread(app)
    where = {"/": "page-error", "/timeline": "timeline-graph", "/operators": "ops-busy", "/memory": "memory-peaks",
             "/compare": "compare-summary", "/tensors": "tensors-first-bad", "/hardware": "hardware-graph",
             "/advisor": "advisor-list"}
    try:
        for path, box in where.items():
            driver.get(f"{url}{path}?run={rid}" + (f"&b={rid}" if path == "/compare" else ""))
            expect = "implementation" if path == "/advisor" else "boom: the store cannot be read"
            wait_text(driver, box, expect)
            text = text_of(driver, box)
            assert "loading…" not in text and len([x for x in text.split("\n") if expect in x]) == 1, (path, text)
    finally:
        srv.shutdown()
        driver.get_log("browser")         # the failed requests are logged there: this test expects them
