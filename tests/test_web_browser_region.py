"""The timeline of a run on a compiler stack, in headless Chromium: each region with the ops its stack's own
profiler timed on the lane beneath it, and a child's details naming its region and that profiler."""
import shutil

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not (shutil.which("chromium") or shutil.which("/usr/bin/chromium")) or not shutil.which("chromedriver"):
    pytest.skip("needs chromium and chromedriver", allow_module_level=True)
pytest.importorskip("onnxruntime")

from opscope.app.web.server import create_app, start_in_thread  # noqa: E402
from opscope.profiler import profile                            # noqa: E402
from opscope.profiler.store import RunStore                     # noqa: E402
from opscope.runtime.models import load                         # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402

from test_web_browser import TIMELINE_DRAWN, TOKEN, driver, text_of, until, wait_text  # noqa: E402,F401

CHILDREN = "↳ onnxruntime profiler"


def click_at(driver, pt):
    """A real mouse click at a client point of the timeline's canvas."""
    over = driver.find_element("css selector", "#timeline-graph .tl-over")
    r = driver.execute_script("var r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];",
                              over)
    ActionChains(driver).move_to_element_with_offset(over, pt["x"] - r[0] - r[2] / 2, pt["y"] - r[1] - r[3] / 2) \
        .pause(0.2).click().perform()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("web-region-store") / "runs.duckdb")
    model, inputs = load("demo:gpt")
    return store, profile("demo:gpt", "onnxruntime", steps=1, store=store, model=model, inputs=inputs)


def test_a_region_shows_its_stack_profiled_ops_beneath_it_and_a_child_names_its_region(driver, run):  # noqa: F811
    store, run_id = run
    srv, url = start_in_thread(create_app(store=store, token=TOKEN))
    try:
        driver.get(f"{url}/timeline?run={run_id}&token={TOKEN}")
        until(driver, TIMELINE_DRAWN)
        tracks = driver.execute_script("return window.opscopeTimeline.labels();")
        region_lane = next(k for k, t in enumerate(tracks) if t.startswith("onnxr"))
        assert tracks[region_lane + 1] == CHILDREN                        # the children's lane, right beneath
        assert driver.execute_script("return window.opscopeTimeline.namesOn(arguments[0]);",    # as the server names it
                                     "onnxruntime · onnxruntime:CPUExecutionProvider") == ["region"]
        children = driver.execute_script("return window.opscopeTimeline.namesOn(arguments[0]);", CHILDREN)
        assert {"linear", "scaled_dot_product_attention"} <= set(children)        # the ones wide enough to draw
        (seq,) = store.query("SELECT seq FROM events WHERE run_id = ? AND depth = 1 ORDER BY end_ns - start_ns DESC "
                             "LIMIT 1", [run_id])[0]
        pt = driver.execute_script("return window.opscopeTimeline.pointOf(0, arguments[0]);", seq)
        click_at(driver, pt)
        wait_text(driver, "timeline-details", "timed by")
        details = text_of(driver, "timeline-details")
        assert "region0" in details and "onnxruntime profiler" in details and "stack's op" in details
        assert f"0 · {seq}" in details and "module path" in details
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        srv.shutdown()
