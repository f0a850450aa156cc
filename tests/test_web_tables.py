"""Every table of the web analyzer, in headless Chromium at a laptop's 1280 px and the screenshots' 1500 px, on real
runs: each header and body cell shows whole inside its table, or the table scrolls sideways with a scrollbar one can
see, its first column staying in view and its last column reached at the far right. Regression: the Ranks table's
"optimizer state" and the Operators table's "achieved GFLOP/s" were cut at the card's edge ("11375." showed half)
with no visible way to the rest."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_web_browser import ROWS, TIMELINE_DRAWN, TIMEOUT, TOKEN, until  # noqa: F401 (skips without chromium)

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from opscope.app.web.browser import headless_chromium
from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler import profile
from opscope.profiler.store import RunStore
from opscope.runtime.models import load

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.multiprocess]
WIDTHS = (1280, 1500)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A sim run and a torch:cpu run (in process), a 2-rank hybrid training run and an `opscope optimize`, both with
    the CLI a user types (their processes run while the in-process runs do)."""
    home = tmp_path_factory.mktemp("tables-home")
    env = dict(os.environ, OPSCOPE_HOME=str(home), OMP_NUM_THREADS="1")
    cli = [sys.executable, "-m", "opscope.app"]
    commands = {"ranks": ["train", "demo:mlp", "--hybrid", "torch:cpu=0.5,numpy=0.5", "--steps", "2"],
                "optimized": ["optimize", "demo:gpt", "-b", "sim:npu-a1", "--cycles", "2", "--steps", "1", "-o",
                              str(home / "gpt.opsplan")]}
    procs = {name: subprocess.Popen(cli + args + ["--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for name, args in commands.items()}
    store = RunStore(home / "runs.duckdb")      # one writer at a time by the store's own lock: the three share it
    model, inputs = load("demo:gpt")
    ids = {"npu": profile("demo:gpt", "sim:npu-a1", steps=1, values=True, store=store, model=model, inputs=inputs),
           "cpu": profile("demo:gpt", "torch:cpu", steps=1, values=True, store=store, model=model, inputs=inputs)}
    for name, p in procs.items():
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        ids[name] = json.loads(out)["run_id"]
    return store, ids


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory):
    # scrollbars drawn (no --hide-scrollbars): the scrollbar a user sees is part of what is checked
    d = headless_chromium(str(tmp_path_factory.mktemp("chrome")))
    srv, url = start_in_thread(create_app(store=runs[0], token=TOKEN))
    d.get(f"{url}/?token={TOKEN}")
    yield d, url
    srv.shutdown()
    d.quit()


# Per table on the page: its cells (header and the rows drawn) outside its visible box, and how it scrolls.
MEASURE = """
function outside(cells, b) {
  return cells.filter(function (c) { var r = c.getBoundingClientRect();
    return r.width >= 1 && (r.left < b.left - 1 || r.right > b.right + 1); })
    .map(function (c) { return (c.getAttribute('col-id') || '') + ' ' + c.innerText.trim().slice(0, 24); });
}
function scroller(e, stop) {       // e or an ancestor (inside the card) that scrolls sideways
  for (; e && e !== stop; e = e.parentElement) {
    var s = getComputedStyle(e);
    if (/auto|scroll/.test(s.overflowX) && e.scrollWidth > e.clientWidth + 1) return e;
  }
  return null;
}
var out = [];
document.querySelectorAll('.grid').forEach(function (g) {
  if (!g.offsetWidth) return;                       // a hidden card: forward vs backward on an inference run
  var root = g.querySelector('.ag-root-wrapper'), b = root.getBoundingClientRect();
  var v = g.querySelector('.ag-body-horizontal-scroll-viewport');
  var first = g.querySelector('.ag-header-row-column .ag-header-cell:not([col-id=ag-Grid-SelectionColumn])');
  var cols = dash_ag_grid.getApi(g.id).getAllDisplayedColumns().map(function (c) { return c.getColId(); })
    .filter(function (c) { return c !== 'ag-Grid-SelectionColumn'; });
  out.push({id: g.id, rows: g.querySelectorAll('.ag-row').length,
            outside: outside([].slice.call(g.querySelectorAll('.ag-header-cell, .ag-row .ag-cell')), b),
            scrolls: !!(v && /auto|scroll/.test(getComputedStyle(v).overflowX) && v.scrollWidth > v.clientWidth + 1),
            bar: v ? v.offsetHeight - v.clientHeight : 0, left: v ? v.scrollLeft : 0,
            first: cols[0], last: cols[cols.length - 1],
            shown: [].slice.call(g.querySelectorAll('.ag-header-cell')).filter(function (c) {
              var r = c.getBoundingClientRect(); return r.width >= 1 && r.left >= b.left - 1 && r.right <= b.right + 1;
            }).map(function (c) { return c.getAttribute('col-id'); })});
});
document.querySelectorAll('table, dl.fields').forEach(function (t) {
  if (!t.offsetWidth) return;
  var card = t.closest('.card') || t.parentElement, b = card.getBoundingClientRect();
  var cs = getComputedStyle(card), box = {left: b.left + parseFloat(cs.paddingLeft), right: b.right - parseFloat(cs.paddingRight)};
  out.push({id: t.className, outside: outside([].slice.call(t.querySelectorAll('th, td, dt, dd')), box),
            scrolls: !!scroller(t, card), plain: true});
});
return out;
"""
SCROLL_RIGHT = """document.querySelectorAll('.grid .ag-body-horizontal-scroll-viewport').forEach(function (v) {
  v.scrollLeft = v.scrollWidth; v.dispatchEvent(new Event('scroll')); });"""


def settled(d, tables):
    """The measurement once the grids are drawn and sized (autosize runs after the rows arrive): the same twice."""
    for t in tables:
        until(d, ROWS, t)
    last, t0 = None, time.time()
    while time.time() - t0 < TIMEOUT:
        now = d.execute_script(MEASURE)
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError(f"the tables kept changing: {last}")


def problems_of(d, tables) -> list[str]:
    found, before = [], settled(d, tables)
    d.execute_script(SCROLL_RIGHT)
    # AG Grid draws the columns scrolled into view on a later frame: wait (bounded) for each wide table's last one
    wide, t0 = [t for t in before if t["outside"] and t["scrolls"] and not t.get("plain")], time.time()
    while True:
        after = {t["id"]: t for t in d.execute_script(MEASURE) if not t.get("plain")}
        if all(t["last"] in after[t["id"]]["shown"] for t in wide) or time.time() - t0 > 10:
            break
        time.sleep(0.2)
    for t in before:
        if not t["outside"]:
            continue
        if not t["scrolls"]:
            found.append(f"{t['id']}: {t['outside'][:4]} cut at the card's edge and the table does not scroll")
        elif t.get("plain"):
            continue
        elif t["bar"] < 8:
            found.append(f"{t['id']}: scrolls sideways with no scrollbar to see ({t['bar']} px)")
        else:
            end = after[t["id"]]["shown"]
            if t["first"] not in end:
                found.append(f"{t['id']}: scrolled to the right, its first column {t['first']!r} is out of view")
            if t["last"] not in end:
                found.append(f"{t['id']}: scrolled to the right end, its last column {t['last']!r} is not in view")
    return found


def click_point(d, pt):
    """A real mouse click at a client point of the timeline's canvas."""
    over = d.find_element(By.CSS_SELECTOR, "#timeline-graph .tl-over")
    r = d.execute_script("var r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];",
                         over)
    ActionChains(d).move_to_element_with_offset(over, pt["x"] - r[0] - r[2] / 2, pt["y"] - r[1] - r[3] / 2) \
        .pause(0.2).click().perform()


PAGES = {   # path (run ids filled in), the tables that must have rows before the page is measured
    "runs": ("/", ["runs-table"]), "operators": ("/operators?run={npu}", ["ops-table"]),
    "memory": ("/memory?run={npu}", ["memory-table"]), "ranks": ("/ranks?run={ranks}", ["ranks-table", "ranks-steps"]),
    "compare": ("/compare?run={cpu}&b={npu}", ["compare-table", "compare-error-table"]),
    "tensors": ("/tensors?run={npu}", ["tensors-table"]), "optimize": ("/optimize?run={optimized}", []),
    "hardware": ("/hardware?run={cpu}", []), "advisor": ("/advisor?run={npu}", []),
}


def test_every_table_shows_whole_or_scrolls_with_its_first_column_kept(page, runs):
    d, url = page
    ids = runs[1]
    d.get_log("browser")
    found = []
    for width in WIDTHS:
        d.set_window_size(width, 1000)
        for name, (path, tables) in PAGES.items():
            d.get(url + path.format(**ids))
            if name == "optimize":
                until(d, "return document.querySelectorAll('.plain-table tr').length > 1;")
            elif name == "hardware":          # an in-process run has no hardware samples: the page says so
                until(d, "var e = document.getElementById('hardware-graph'); return !!(e && (e.querySelector("
                         "'.js-plotly-plot') || e.innerText.indexOf('not available') >= 0));")
            elif name == "advisor":
                until(d, "return document.querySelectorAll('#advisor-list .card').length > 0;")
            found += [f"{width} px {name}: {p}" for p in problems_of(d, tables)]
        # the timeline's side panels: what the window holds, and a span's details (the widest span clicked)
        d.get(f"{url}/timeline?run={ids['npu']}")
        until(d, TIMELINE_DRAWN)
        until(d, "return document.querySelectorAll('#timeline-graph .tl-summary tr[data-name]').length > 0;")
        click_point(d, d.execute_script("return window.opscopeTimeline.widestSpanPoint();"))
        until(d, "return !!document.querySelector('dl.fields');")
        found += [f"{width} px timeline: {p}" for p in problems_of(d, [])]
        # the page itself never scrolls sideways: the top bar's ten links and the run's counts fit
        wide = d.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
        if wide > 0:
            found.append(f"{width} px: the page is {wide} px wider than the window")
    assert not found, "\n".join(found)
    severe = [e["message"] for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe
