"""The analyzer's Perfetto-class tools in headless Chromium (issue 38), on real runs: the SQL console (rows, and
each hostile query refused or bounded in one line), the flame graph, the timeline's area selection, pinned tracks
and measure, and the memory page's allocations paired with frees. Real clicks, drags and keys throughout."""
import shutil

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not (shutil.which("chromium") or shutil.which("/usr/bin/chromium")) or not shutil.which("chromedriver"):
    pytest.skip("needs chromium and chromedriver", allow_module_level=True)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.actions.action_builder import ActionBuilder  # noqa: E402
from selenium.webdriver.common.by import By                     # noqa: E402
from selenium.webdriver.common.keys import Keys                 # noqa: E402

from opscope.app.pages import sql as sql_page                   # noqa: E402
from opscope.app.web.server import create_app, start_in_thread  # noqa: E402
from opscope.profiler import profile                            # noqa: E402
from opscope.profiler.store import RunStore                     # noqa: E402
from opscope.runtime.models import load                         # noqa: E402

from test_web_browser import TIMELINE_DRAWN, TOKEN, driver, text_of, until, wait_text  # noqa: E402,F401

LEAK = 1000 * 100 * 4            # bytes of each tensor the traced loop keeps (never freed in the trace)


def torch_trace(path):
    """A real torch.profiler trace of two training steps, with memory, shapes and Python stacks; each step keeps
    one tensor it never frees."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    x, kept = torch.randn(16, 64), []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, profile_memory=True) as prof:
        for _ in range(2):
            model(x).square().mean().backward()
            kept.append(torch.empty(1000, 100))
    prof.export_chrome_trace(str(path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from opscope.profiler.importers import import_trace
    folder = tmp_path_factory.mktemp("web-tools-store")
    store = RunStore(folder / "runs.duckdb")
    model, inputs = load("demo:gpt")
    graph = profile("demo:gpt", "torch:cpu", steps=1, store=store, model=model, inputs=inputs)
    torch_trace(folder / "train.pt.trace.json")
    imported = import_trace(folder / "train.pt.trace.json", store=store)
    return store, graph, imported


@pytest.fixture(scope="module")
def server(runs, driver):
    srv, url = start_in_thread(create_app(store=runs[0], token=TOKEN))
    driver.get(f"{url}/?token={TOKEN}")
    yield url
    srv.shutdown()


@pytest.fixture
def browser(driver):
    driver.get_log("browser")
    yield driver
    severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"
              and "_dash-update-component" not in e["message"]]       # a refused query is a 4xx/5xx by design
    assert not severe, severe


def in_view(browser, script, *args):
    """A client point a page's script gives, scrolled into the window first (a deep stack is taller than it)."""
    pt = browser.execute_script(script, *args)
    height = browser.execute_script("return window.innerHeight;")
    if not 10 < pt["y"] < height - 10:
        browser.execute_script("window.scrollBy(0, arguments[0]);", pt["y"] - height / 2)
        pt = browser.execute_script(script, *args)
    return pt


def mouse(browser, *points, press=False):
    """A real mouse, in the window's coordinates: to the first point; with press, held down through the others."""
    ab = ActionBuilder(browser)
    ab.pointer_action.move_to_location(int(points[0]["x"]), int(points[0]["y"]))
    if press:
        ab.pointer_action.pointer_down()
    for p in points[1:]:
        ab.pointer_action.move_to_location(int(p["x"]), int(p["y"]))
    if press:
        ab.pointer_action.pointer_up()
    ab.perform()


def run_sql(browser, text):
    box = browser.find_element(By.ID, "sql-text")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text)
    browser.execute_script("window.dash_clientside.set_props('sql-out', {children: null});")
    box.send_keys(Keys.CONTROL, Keys.ENTER)                            # Ctrl+Enter runs it, as the page says
    until(browser, "var e = document.getElementById('sql-out');"
                   "return e.querySelector('.sql-error') || (e.querySelector('.sql-line') && e.querySelector('.ag-row'));")
    return text_of(browser, "sql-out")


def test_the_sql_console_returns_rows_and_refuses_or_bounds_hostile_queries_in_one_line(browser, server, runs,
                                                                                        monkeypatch):
    store, graph, _ = runs
    monkeypatch.setattr(sql_page, "SECONDS", 3.0)        # the server is in this process: a 3 s bound, not 10 s
    browser.get(f"{server}/sql?run={graph}")
    wait_text(browser, "sql-tables", "events")
    out = run_sql(browser, "SELECT op, count(*) AS n FROM events GROUP BY op ORDER BY n DESC, op")
    (n_linear,) = store.query("SELECT count(*) FROM events WHERE run_id = ? AND op = 'linear'", [graph])[0]
    assert "rows · 2 columns" in out and "linear" in out and f"{n_linear}" in out
    assert browser.find_elements(By.CSS_SELECTOR, "#sql-out .ag-row")
    for hostile, says in [("COPY (SELECT 1) TO '/tmp/opscope-web-sql.csv'", "COPY is refused"),
                          ("ATTACH '/tmp/opscope-web-sql.db'", "ATTACH is refused"),
                          ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
                          ("INSTALL httpfs", "is refused"),
                          ("SELECT count(*) FROM range(100000000000) a, range(1000) b", "ran past 3 s")]:
        out = run_sql(browser, hostile)
        assert says in out and len(out.strip().splitlines()) == 1, (hostile, out)
    # a billion rows: the page gets the first ROWS, and one line says there are more
    out = run_sql(browser, "SELECT * FROM range(1000000000)")
    assert out.splitlines()[0].startswith(f"the first {sql_page.ROWS:,} rows (the query gives more")


def test_the_flame_graph_shows_python_stacks_with_self_and_total_time_and_zooms_on_click(browser, server, runs):
    _, _, imported = runs
    browser.get(f"{server}/flame?run={imported}")
    state = until(browser, "return window.opscopeFlame && window.opscopeFlame.state();")
    assert state["kind"] == "stacks" and state["drawn"] > 5
    child = browser.execute_script("return window.opscopeFlame.node(1);")      # the widest frame under the root
    root = browser.execute_script("return window.opscopeFlame.node(0);")
    assert 0 < child["total"] <= root["total"] and 0 <= child["self"] <= child["total"]
    pt = in_view(browser, "return window.opscopeFlame.pointOf(arguments[0]);", child["name"])
    mouse(browser, pt)
    until(browser, "var t = document.querySelector('#flame-graph .tl-tip'); "
                   "return t && t.style.display === 'block' && t.innerText.indexOf('self') >= 0;")
    ActionChains(browser).click().perform()
    until(browser, "return window.opscopeFlame.state().focus === arguments[0];", pt["i"])
    assert child["name"] in text_of(browser, "flame-graph") and "whole tree" in text_of(browser, "flame-graph")
    assert "left out" not in text_of(browser, "flame-graph")       # a small tree is drawn whole
    until(browser, "return document.querySelectorAll('#flame-table .ag-row').length > 0;")
    browser.find_element(By.CSS_SELECTOR, "#flame-graph .flame-out").click()
    until(browser, "return window.opscopeFlame.state().focus === 0;")
    # op nesting: the trace's ops, nested as the timeline's lanes nest them
    browser.find_element(By.CSS_SELECTOR, "#flame-kind input[value='ops']").click()
    until(browser, "var s = window.opscopeFlame.state(); return s && s.kind === 'ops' && s.drawn > 3;")
    names = browser.execute_script("var s = window.opscopeFlame.state(), out = [];"
                                   "for (var i = 0; i < s.nodes; i++) out.push(window.opscopeFlame.node(i).name);"
                                   "return out;")
    assert "aten::addmm" in names or "aten::linear" in names


def drag(browser, a, b):
    mid = {"x": (a["x"] + b["x"]) / 2, "y": (a["y"] + b["y"]) / 2}
    mouse(browser, a, mid, b, press=True)


TOOLS = "return window.opscopeTimelineTools.state();"


def test_area_selection_sums_the_ops_inside_with_shares_within_100(browser, server, runs):
    store, graph, _ = runs
    browser.get(f"{server}/timeline?run={graph}")
    until(browser, TIMELINE_DRAWN)
    tracks = browser.execute_script("return window.opscopeTimeline.tracks();")
    browser.find_element(By.CSS_SELECTOR, "#timeline-tools button[data-mode='area']").click()
    s = browser.execute_script("return window.opscopeTimeline.state();")
    t0, t1 = s["t0"] + 0.2 * (s["t1"] - s["t0"]), s["t0"] + 0.7 * (s["t1"] - s["t0"])
    a = in_view(browser, "return window.opscopeTimelineTools.plotPoint(arguments[0], 0);", t0)
    b = browser.execute_script("return window.opscopeTimelineTools.plotPoint(arguments[0], arguments[1]);", t1,
                               len(tracks) - 1)
    drag(browser, a, b)
    area = until(browser, "var s = window.opscopeTimelineTools.state(); return s.area;")
    assert len(area["tracks"]) == len(tracks)
    until(browser, "return document.querySelectorAll('#timeline-area-out .ag-row').length > 0;")
    head = text_of(browser, "timeline-area-out")
    assert "spans" in head and "share of area" in head
    shares = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-area-out .ag-center-cols-container "
        "[col-id=share]')).map(function (e) { return parseFloat(e.innerText); });")
    assert shares and all(0 <= x <= 100 for x in shares) and sum(shares) <= 100.5
    # the store agrees: the ops that overlap the area, by name, are the rows
    first = store.query("SELECT min(start_ns) FROM events WHERE run_id = ?", [graph])[0][0]
    want = {r[0] for r in store.query("SELECT DISTINCT op FROM events WHERE run_id = ? AND end_ns > ? AND start_ns < ?",
                                      [graph, first + int(area["t0"]), first + int(area["t1"])])}
    names = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-area-out .ag-pinned-left-cols-container "
        "[col-id=name]')).map(function (e) { return e.innerText.trim(); });")
    assert set(names) <= want and len(names) == min(len(want), 15)
    # Esc clears the area and its table
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    until(browser, "return !window.opscopeTimelineTools.state().area;")
    wait_text(browser, "timeline-area-out", "drag across tracks")
    # a click (not a drag) in area mode still picks the span under it, as in zoom mode
    pt = in_view(browser, "return window.opscopeTimeline.widestSpanPoint();")
    mouse(browser, pt)
    ActionChains(browser).click().perform()
    until(browser, "return !!window.opscopeTimeline.state().picked;")
    wait_text(browser, "timeline-details", "module path")
    assert browser.execute_script(TOOLS)["mode"] == "area" and not browser.execute_script(TOOLS)["area"]


def test_a_pinned_track_moves_to_the_top_and_measure_reads_the_time_between_two_points(browser, server, runs):
    _, _, imported = runs
    browser.get(f"{server}/timeline?run={imported}")
    until(browser, TIMELINE_DRAWN)
    tracks = browser.execute_script("return window.opscopeTimeline.tracks();")
    last = len(tracks) - 1
    assert tracks[last] != tracks[0]
    pt = in_view(browser, "return window.opscopeTimelineTools.gutterPoint(arguments[0]);", last)
    mouse(browser, pt)
    ActionChains(browser).click().perform()
    state = until(browser, "var s = window.opscopeTimelineTools.state(); return s.pinned > 0 && s;")
    assert state["tracks"][0] == tracks[last] and sorted(state["tracks"]) == sorted(tracks)
    assert browser.execute_script("return window.opscopeTimeline.tracks()[0];") == tracks[last]
    # the pin stays when the view changes (a new window answer is arranged the same way)
    fetches = browser.execute_script("var s = window.opscopeTimeline.state(); "
                                     "window.opscopeTimeline.setView(s.t0, s.t0 + (s.t1 - s.t0) / 2); return s.fetches;")
    until(browser, "var s = window.opscopeTimeline.state(); return !s.busy && s.fetches > arguments[0];", fetches)
    assert browser.execute_script(TOOLS)["tracks"][0] == tracks[last]
    # measure: a drag from 30% to 60% of the window reads their distance
    browser.execute_script("window.scrollTo(0, 0);")                  # the tool bar, out from under the header
    browser.find_element(By.CSS_SELECTOR, "#timeline-tools button[data-mode='measure']").click()
    s = browser.execute_script("return window.opscopeTimeline.state();")
    ta, tb = s["t0"] + 0.3 * (s["t1"] - s["t0"]), s["t0"] + 0.6 * (s["t1"] - s["t0"])
    a, b = (in_view(browser, "return window.opscopeTimelineTools.plotPoint(arguments[0], 1);", t) for t in (ta, tb))
    drag(browser, a, b)
    got = until(browser, "return window.opscopeTimelineTools.state().measure;")
    px = (s["t1"] - s["t0"]) / browser.execute_script("return window.opscopeTimeline.tools.get().px;")
    assert abs(got - (tb - ta)) <= 3 * px
    assert "measured" in text_of(browser, "timeline-measure")
    # click the pinned track's name again: unpinned, the server's order back
    pt = in_view(browser, "return window.opscopeTimelineTools.gutterPoint(0);")
    mouse(browser, pt)
    ActionChains(browser).click().perform()
    until(browser, "return window.opscopeTimelineTools.state().pinned === 0;")
    assert browser.execute_script("return window.opscopeTimeline.tracks();") == tracks


def test_the_memory_page_pairs_allocations_with_frees_and_names_what_is_never_freed(browser, server, runs):
    store, graph, imported = runs
    browser.get(f"{server}/memory?run={imported}")
    wait_text(browser, "memory-lifetimes", "never freed")
    until(browser, "return document.querySelectorAll('#memory-leaks .ag-row').length > 0;")
    text = text_of(browser, "memory-lifetimes")
    assert "allocations" in text and "peak" in text and "aten::empty" in text
    assert "390.6 KiB" in text_of(browser, "memory-leaks")            # each kept tensor: 1000 x 100 float32
    until(browser, "var gd = document.querySelector('#memory-lifetimes-graph .js-plotly-plot');"
                   "return !!(gd && gd.data && gd.data.length);")
    # an opscope run: the plan's buffers, paired step by step; the model's output is kept past the step
    browser.get(f"{server}/memory?run={graph}")
    wait_text(browser, "memory-lifetimes", "allocations")
    until(browser, "return document.querySelectorAll('#memory-sites .ag-row').length > 0;")
    assert "kept past the step" in text_of(browser, "memory-lifetimes")
