"""Issue 27 in headless Chromium: an imported torch.profiler training trace's ops appear under their own names on
the Operators page, and its row's link finds `aten::mm` on the timeline; Compare of 5 and 2 steps of one model
reads 1.00x per op."""
import pytest

from test_web_browser import ROWS, TIMEOUT, TOKEN, text_of, until, wait_text  # noqa: F401 (skips without chromium)

from opscope.app.web.browser import headless_chromium
from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler import profile
from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore
from opscope.runtime.models import load

from torch_traces import record_training

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("web-store") / "runs.duckdb")
    store.trace = import_trace(record_training(tmp_path_factory.mktemp("trace") / "train.json"), store)
    model, inputs = load("demo:mlp")
    store.five = profile("demo:mlp", "sim:npu-a1", steps=5, store=store, model=model, inputs=inputs)
    store.two = profile("demo:mlp", "sim:npu-a1", steps=2, store=store, model=model, inputs=inputs)
    return store


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory):
    d = headless_chromium(str(tmp_path_factory.mktemp("chrome")))
    d.set_window_size(1500, 1000)
    srv, url = start_in_thread(create_app(store=runs, token=TOKEN))
    d.get(f"{url}/?token={TOKEN}")
    yield d, url
    srv.shutdown()
    d.quit()


def _no_errors(d):
    severe = [e["message"] for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe


def test_aten_mm_on_the_operators_page_and_found_on_the_timeline(page, runs):
    d, url = page
    d.get_log("browser")
    d.get(f"{url}/operators?run={runs.trace}")
    until(d, ROWS, "ops-table")
    cell = until(d, """var cells = document.querySelectorAll('#ops-table .ag-row .ag-cell[col-id=name]');
        for (var i = 0; i < cells.length; i++) if (cells[i].innerText.trim() === 'aten::mm') return cells[i];""")
    cell.click()
    wait_text(d, "ops-detail", "calls")
    assert "Find every aten::mm" in text_of(d, "ops-detail")
    until(d, "return document.getElementById('ops-find');").click()
    until(d, "var s = window.opscopeTimeline && window.opscopeTimeline.state();"
             "return !!(s && s.find === 'aten::mm' && s.draws && !s.busy);")
    wait_text(d, "timeline-info", "matches for 'aten::mm'")
    assert " 0 matches" not in text_of(d, "timeline-info")
    _no_errors(d)


def test_compare_of_5_and_2_steps_reads_1x(page, runs):
    d, url = page
    d.get_log("browser")
    d.get(f"{url}/compare?run={runs.five}&b={runs.two}")
    wait_text(d, "compare-summary", runs.two[:12])
    until(d, ROWS, "compare-table")
    cells = until(d, "var c = [...document.querySelectorAll('#compare-table .ag-cell[col-id=ratio]')]"
                     ".map(e => e.innerText); return c.length ? c : null;")
    assert {c for c in cells if c} == {"1.00x"}, cells                   # was 0.40x: totals over 5 vs 2 steps
    assert "1.00x" in text_of(d, "compare-summary")
    _no_errors(d)
