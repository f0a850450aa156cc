"""The Optimize page: the cycles of `opscope optimize` as a chart (estimated vs measured gain per cycle), each
cycle linking its run; from the baseline run, from any cycle's run, and in Chromium on a real optimization."""
import json
import shutil

import pytest

from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.store import RunStore

from test_web_ranks import _callback, find, text_of

CYCLES = [("fuse", 7.3e-05, 7.1e-05, True), ("layout", 2.0e-05, -1.0e-06, False), ("fold", 1.6e-05, 1.5e-05, True)]


def an_optimization(store):
    """The runs app/cli/optimize.py leaves: a baseline holding the cycles, one run per cycle, each the child of
    the run before it."""
    base = store.create_run(model="demo:gpt", backend="sim:npu-a1", config={"optimize": "baseline"})
    parent, rows = base, []
    for i, (name, est, got, kept) in enumerate(CYCLES, 1):
        run = store.create_run(model="demo:gpt", backend=f"sim:npu-a1+{name}", parent_run=parent,
                               config={"optimize": {"cycle": i, "pass": name, "advice": f"cost-model:{name}"}})
        rows.append({"cycle": i, "pass": name, "advice": f"cost-model:{name}", "source": "cost model",
                     "estimated_seconds": est, "measured_seconds": got, "kept": kept, "why": f"{name} why",
                     "run_id": run, "step_seconds": 5e-4 - i * 1e-5, "throughput": 4000.0, "peak_bytes": 2**21,
                     "max_abs_err": 1e-6})
        parent = run
    for rid in [base] + [r["run_id"] for r in rows]:
        store.finish_run(rid, "ok")
    store.update_run(base, config={"optimize": {"cycles": rows, "passes": ["fold", "fuse"], "plan": "gpt.opsplan",
                                                "baseline": {"step_seconds": 5e-4, "peak_bytes": 2**21},
                                                "final": {"step_seconds": 4.2e-4, "peak_bytes": 2**21}}})
    return base, rows


def bar_heights(fig, name) -> list[float]:
    """The bars of one series, as drawn (components.bar_figure: a filled rectangle each, bottom at 0)."""
    [bars] = [t for t in fig["data"] if t["name"] == name and t.get("fill") == "toself"]
    ys = bars["y"]
    return [ys[i + 1] for i in range(0, len(ys), 6)]


def _page(app, rid):
    body = _callback(app, "optimize-chart", {"run": rid, "status": "ok", "events": 0, "dropped": 0})
    return json.loads(body)["response"]


def _links(tree) -> list[str]:
    if isinstance(tree, list):
        return [h for t in tree for h in _links(t)]
    if isinstance(tree, dict) and "props" in tree:
        here = [tree["props"]["href"]] if tree.get("type") == "Link" else []
        return here + _links(tree["props"].get("children"))
    return []


def test_the_chart_has_estimate_and_measured_per_cycle_and_each_cycle_links_its_run(opscope_home):
    store = RunStore()
    base, rows = an_optimization(store)
    app = create_app(store=store)
    page = _page(app, base)
    fig = find(page["optimize-chart"]["children"], "optimize-gains")["props"]["figure"]
    assert fig["layout"]["xaxis"]["ticktext"] == ["1 · fuse", "2 · layout (not kept)", "3 · fold"]
    est, got = bar_heights(fig, "estimated gain"), bar_heights(fig, "measured gain")
    assert est == pytest.approx([73.0, 20.0, 16.0]) and got == pytest.approx([71.0, -1.0, 15.0])
    links = _links(page["optimize-cycles"]["children"])
    assert links == [f"/timeline?run={base}"] + [f"/timeline?run={r['run_id']}" for r in rows]
    # a cycle's run leads back to its optimization
    page = _page(app, rows[2]["run_id"])
    assert "is cycle 3 of this optimization" in text_of(page["optimize-chart"]["children"])
    assert find(page["optimize-chart"]["children"], "optimize-gains") is not None


def test_without_an_optimization_the_page_says_how_to_make_one(opscope_home):
    from test_web_security import a_run
    store = RunStore()
    rid = a_run(store)
    page = _page(create_app(store=store), rid)
    assert "opscope optimize MODEL" in text_of(page["optimize-chart"]["children"])


@pytest.mark.browser
@pytest.mark.multiprocess
@pytest.mark.slow
def test_in_a_browser_the_cycles_chart_of_a_real_optimization_links_each_cycles_run(cli, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from test_web_browser import until, wait_text

    from opscope.app.web.browser import headless_chromium
    r = cli("optimize", "demo:gpt", "-b", "sim:npu-a1", "--cycles", "2", "--steps", "1", "-o",
            tmp_path / "gpt.opsplan", "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["cycles"], doc                     # demo:gpt on the NPU simulator: fusion helps in cycle 1
    srv, url = start_in_thread(create_app(store=RunStore()))
    driver = headless_chromium(str(tmp_path / "chrome"))
    try:
        driver.get(f"{url}/optimize?run={doc['run_id']}")
        wait_text(driver, "optimize-cycles", doc["cycles"][0]["why"])
        # drawn: the two series (estimate, measurement) filled, a tick per cycle
        fills = until(driver, "return document.querySelectorAll('#optimize-gains .scatterlayer .js-fill').length")
        assert fills == 2
        ticks = driver.execute_script("return [...document.querySelectorAll('#optimize-gains .xtick text')]"
                                      ".map(t => t.textContent)")
        assert ticks == [f"{c['cycle']} · {c['pass']}" + ("" if c["kept"] else " (not kept)") for c in doc["cycles"]]
        last = doc["cycles"][-1]["run_id"]
        driver.find_element("css selector", f"#optimize-cycles a[href='/timeline?run={last}']").click()
        until(driver, "return location.pathname === '/timeline' && location.search === arguments[0]", f"?run={last}")
        wait_text(driver, "run-badge", last[:12])
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()
