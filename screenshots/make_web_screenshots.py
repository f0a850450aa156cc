"""Render each page of the web analyzer in headless Chromium, on real runs; write web-<page>.png here.

    python screenshots/make_web_screenshots.py            # fresh runs in a temporary OPSCOPE_HOME
    python screenshots/make_web_screenshots.py --reuse    # use the runs already in $OPSCOPE_HOME
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_runs():
    """The GPT demo on the NPU simulator and on torch:cpu, both with tensor values, plus a failed run.

    The two real runs go through the runner process, as `opscope profile` does, so they carry hardware samples."""
    from opscope.profiler import RunFailed, profile
    # A real failure: a model that keeps dropout in training mode, which the numpy kernels refuse.
    model = Path(tempfile.mkdtemp(prefix="opscope-shots-")) / "train_dropout.py"
    model.write_text("import torch\n\n\nclass M(torch.nn.Module):\n    def __init__(self):\n"
                     "        super().__init__()\n        self.fc = torch.nn.Linear(64, 64)\n\n"
                     "    def forward(self, x):\n"
                     "        return torch.nn.functional.dropout(self.fc(x), 0.1, training=True)\n\n\n"
                     "def factory():\n    return M(), (torch.randn(8, 64),)\n")
    try:
        profile(f"{model}:factory", "sim:edge-gpu")
    except RunFailed:
        pass
    a = profile("demo:gpt", "sim:npu-a1", steps=2, values=True)
    b = profile("demo:gpt", "torch:cpu", steps=2, values=True)
    return a, b


def kineto_gpu_run() -> str:
    """An imported torch.profiler GPU trace (Kineto JSON): two steps of linear > addmm, gelu, softmax on the host,
    their kernels on two streams, copies, and the flows from each launch to its kernel; through `trace import`."""
    import json

    from opscope.profiler.importers import import_trace
    t0, host, events, corr = 1_700_000_000_000_000, 4242, [], [100]
    x = (lambda cat, name, ts, dur, args, pid=host, tid=host: {"ph": "X", "cat": cat, "name": name, "pid": pid,
                                                                "tid": tid, "ts": t0 + ts, "dur": dur, "args": args})

    def launch(ts, stream, cat, name, gpu_ts, gpu_dur, ext):
        corr[0] += 1
        c = corr[0]
        events.extend([x("cuda_runtime", "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync", ts, 6,
                         {"correlation": c, "External id": ext}),
                       x(cat, name, gpu_ts, gpu_dur, {"External id": ext, "device": 0, "stream": stream,
                                                      "correlation": c, "grid": [66, 1, 1], "block": [128, 1, 1]},
                         pid=0, tid=stream),
                       {"ph": "s", "id": c, "pid": host, "tid": host, "ts": t0 + ts, "cat": "ac2g", "name": "ac2g"},
                       {"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": t0 + gpu_ts, "cat": "ac2g", "name": "ac2g",
                        "bp": "e"}])

    ext = [0]

    def op(name, ts, dur, dims):
        ext[0] += 1                    # each op its own External id: what ties a launch (and its kernel) to it
        events.append(x("cpu_op", name, ts, dur, {"External id": ext[0], "Input Dims": dims,
                                                  "Input type": ["float"] * len(dims)}))
        return ext[0]

    for step, base in enumerate((0, 900)):
        ext[0] += 1
        events.append(x("user_annotation", f"ProfilerStep#{step}", base, 820, {"External id": ext[0]}))
        e = op("aten::copy_", base + 10, 40, [[64, 512], [64, 512]])
        launch(base + 20, 13, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", base + 30, 60, e)
        op("aten::linear", base + 60, 200, [[64, 512], [2048, 512], [2048]])
        e = op("aten::addmm", base + 80, 160, [[2048], [64, 512], [512, 2048]])
        launch(base + 100, 7, "kernel", "ampere_sgemm_128x64_tn", base + 120, 260, e)
        e = op("aten::gelu", base + 280, 60, [[64, 2048]])
        launch(base + 300, 7, "kernel", "vectorized_elementwise_kernel<gelu>", base + 381, 70, e)
        e = op("aten::softmax", base + 360, 80, [[64, 2048]])
        launch(base + 380, 7, "kernel", "cunn_SoftMaxForward<float>", base + 452, 120, e)
        launch(base + 420, 13, "gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", base + 575, 90, e)
    path = Path(tempfile.mkdtemp(prefix="opscope-shots-")) / "gpu.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return import_trace(path)


def train_run() -> str:
    """demo:gpt trained 2 steps on the NPU simulator (`opscope profile demo:gpt --train --steps 2`): phases,
    backward-to-forward links and memory by category."""
    from opscope.profiler import profile
    return profile("demo:gpt", "sim:npu-a1", steps=2, train={"optimizer": "sgd"})


def click_point(driver, pt):
    """A real mouse click at a client point of the timeline's canvas."""
    from selenium.webdriver.common.action_chains import ActionChains
    over = driver.find_element("css selector", "#timeline-graph .tl-over")
    r = driver.execute_script("var r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];",
                              over)
    ActionChains(driver).move_to_element_with_offset(over, pt["x"] - r[0] - r[2] / 2, pt["y"] - r[1] - r[3] / 2) \
        .pause(0.2).click().perform()


def click_backward(run_id, op="gelu_backward"):
    """Click a backward op of step 1 (the widest of `op`), as a user asks "what does this differentiate?"."""
    def do(driver):
        from opscope.profiler.store import RunStore
        rows = RunStore().query("SELECT step, seq FROM events WHERE run_id = ? AND step = 1 AND phase = 'backward' "
                                "AND fwd_node <> '' ORDER BY op = ? DESC, end_ns - start_ns DESC LIMIT 1", [run_id, op])
        # zoom to step 1's backward phase (its span on the phase band), where a backward op is wide enough to click
        band = driver.execute_script("return window.opscopeTimeline.spanAt(-4, 9);")
        if band:
            driver.execute_script("window.opscopeTimeline.setView(arguments[0], arguments[1]);",
                                  band["start"] - (band["end"] - band["start"]) * 0.1, band["end"] * 1.0005)
            time.sleep(2.0)
            settle(driver)
        pt = rows and driver.execute_script("return window.opscopeTimeline.pointOf(arguments[0], arguments[1]);",
                                            *rows[0])
        if pt:
            click_point(driver, pt)
    return do


def chromium(width=1500, height=1000):
    # NOTE: no --hide-scrollbars: it hides every scrollbar, so a table that scrolls sideways (the Operators page's)
    # showed no way to its other columns; the window is as tall as the page, so no page scrollbar shows anyway
    from opscope.app.web.browser import headless_chromium
    return headless_chromium(width=width, height=height, extra=("--force-device-scale-factor=1",))


def settle(driver, timeout=30):
    """Wait until Dash has no callback in flight and every graph has drawn."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        busy = driver.execute_script(
            "return !!document.querySelector('[data-dash-is-loading=\"true\"]') || "
            "document.title.indexOf('Updating') >= 0;")
        if not busy:
            time.sleep(0.6)
            if not driver.execute_script("return !!document.querySelector('[data-dash-is-loading=\"true\"]');"):
                return
        time.sleep(0.2)


def shoot(driver, url, name, before=None):
    driver.get(url)
    time.sleep(1.0)
    settle(driver)
    if before:
        before(driver)
        settle(driver)
    height = driver.execute_script("return Math.min(2400, document.body.scrollHeight)")
    # the window's height counts the browser's own bars too: the page gets what is left
    bars = driver.execute_script("return window.outerHeight - window.innerHeight")
    driver.set_window_size(1500, max(800, height) + bars)
    time.sleep(0.4)
    out = HERE / f"web-{name}.png"
    driver.save_screenshot(str(out))
    driver.set_window_size(1500, 1000)
    print(f"wrote {out}")


def click_span(driver):
    """Click the middle of the widest span drawn (what a user does first), with a real mouse."""
    pt = driver.execute_script("return window.opscopeTimeline && window.opscopeTimeline.widestSpanPoint();")
    if pt:
        click_point(driver, pt)


def click_child(run_id: str, step: int = 1):
    """Click the step's longest child of a region (an op as the stack's own profiler timed it), with a real mouse."""
    def do(driver):
        from opscope.profiler.store import RunStore
        rows = RunStore().query("SELECT seq FROM events WHERE run_id = ? AND step = ? AND depth = 1 AND parent <> '' "
                                "ORDER BY end_ns - start_ns DESC LIMIT 1", [run_id, step])
        pt = rows and driver.execute_script("return window.opscopeTimeline.pointOf(arguments[0], arguments[1]);",
                                            step, rows[0][0])
        if pt:
            click_point(driver, pt)
    return do


def find_next(times=2):
    """Enter in the timeline's find box, as a user walks the matches."""
    def do(driver):
        from selenium.webdriver.common.keys import Keys
        box = driver.find_element("id", "timeline-find")
        for _ in range(times):
            box.send_keys(Keys.ENTER)
            time.sleep(0.8)
    return do


def click_cell(table_id, row=0, col=0):
    def do(driver):
        from selenium.webdriver.common.by import By
        # a cell of the row, not the runs table's tick box
        cells = driver.find_elements(By.CSS_SELECTOR,
                                     f"#{table_id} .ag-row .ag-cell:not([col-id=ag-Grid-SelectionColumn])")
        if cells:
            cells[0].click()
    return do


def ranks_and_optimize_runs() -> tuple[str, str]:
    """A 2-rank hybrid training run over gloo and `opscope optimize` cycles, each made with the CLI a user types
    in the current OPSCOPE_HOME: (ranks run, optimized run)."""
    import json
    import subprocess

    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "opscope.app", *args, "--json"], capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout)["run_id"]

    ranks = cli("train", "demo:mlp", "--hybrid", "torch:cpu=0.5,numpy=0.5", "--steps", "4")
    # the plan goes beside the runs, not into the checkout (optimize's default is the current folder)
    plan = os.path.join(os.environ.get("OPSCOPE_HOME") or tempfile.gettempdir(), "gpt.opsplan")
    optimized = cli("optimize", "demo:gpt", "-b", "sim:npu-a1", "--cycles", "3", "--steps", "1", "-o", plan)
    return ranks, optimized


def torch_profiler_import() -> str:
    """A real torch.profiler trace of three training steps (shapes, Python stacks, memory, a record_function per
    step, the schedule's ProfilerStep marks), through `opscope trace import`: its run id."""
    import json
    import subprocess

    import torch
    path = Path(tempfile.mkdtemp(prefix="opscope-shots-")) / "train.pt.trace.json"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, profile_memory=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)) as prof:
        for step in range(4):
            with torch.profiler.record_function(f"train_step_{step}"):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            prof.step()
    prof.export_chrome_trace(str(path))
    out = subprocess.run([sys.executable, "-m", "opscope.app", "trace", "import", str(path), "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["run_id"]


def stack_region_run() -> str:
    """demo:gpt on ONNX Runtime through `opscope profile`: one region per step, its ops beneath it as ONNX
    Runtime's own profiler timed them; the run id."""
    import json
    import subprocess
    out = subprocess.run([sys.executable, "-m", "opscope.app", "profile", "demo:gpt", "-b", "onnxruntime", "--steps",
                          "2", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["run_id"]


def shoot_ranks_and_optimize(driver, url, ranks: str, optimized: str) -> None:
    """web-ranks.png, web-timeline-ranks.png (both ranks' lanes and their collectives) and web-optimize.png."""
    shoot(driver, f"{url}/ranks?run={ranks}", "ranks")
    shoot(driver, f"{url}/timeline?run={ranks}&step=1", "timeline-ranks")
    shoot(driver, f"{url}/optimize?run={optimized}", "optimize")


def run_query(driver):
    """The SQL page's first example, run with Ctrl+Enter as a user does."""
    from selenium.webdriver.common.keys import Keys
    driver.find_element("id", "sql-text").send_keys(Keys.CONTROL, Keys.ENTER)
    t0 = time.time()
    while time.time() - t0 < 60 and not driver.execute_script("return !!document.querySelector('#sql-out .ag-row');"):
        time.sleep(0.2)


def timeline_tools(driver):
    """The timeline's tools at once: the last track pinned on top, an area selected over the middle of the step
    (its summary under the timeline), and a measure across a quarter of the window. Real mouse events."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    tools = "return window.opscopeTimelineTools"
    drawn("var s = window.opscopeTimeline && window.opscopeTimeline.state(); return !!(s && s.draws && !s.busy);")(driver)

    def mouse(*pts, press=False):
        ab = ActionBuilder(driver)
        ab.pointer_action.move_to_location(int(pts[0]["x"]), int(pts[0]["y"]))
        if press:
            ab.pointer_action.pointer_down()
        for p in pts[1:]:
            ab.pointer_action.move_to_location(int(p["x"]), int(p["y"]))
        if press:
            ab.pointer_action.pointer_up()
        ab.perform()

    n = len(driver.execute_script("return window.opscopeTimeline.tracks();"))
    mouse(driver.execute_script(tools + ".gutterPoint(arguments[0]);", n - 1))
    from selenium.webdriver.common.action_chains import ActionChains
    ActionChains(driver).click().perform()
    time.sleep(0.5)
    s = driver.execute_script("return window.opscopeTimeline.state();")
    at = (lambda f, row: driver.execute_script(tools + ".plotPoint(arguments[0], arguments[1]);",
                                               s["t0"] + f * (s["t1"] - s["t0"]), row))
    driver.find_element("css selector", "#timeline-tools button[data-mode='area']").click()
    mouse(at(0.35, 1), at(0.5, 2), at(0.62, min(3, n - 1)), press=True)
    time.sleep(1.5)
    driver.find_element("css selector", "#timeline-tools button[data-mode='measure']").click()
    mouse(at(0.1, 0), at(0.2, 0), at(0.3, 0), press=True)
    mouse({"x": 5, "y": 300})               # off the canvas: no tooltip over the picture
    time.sleep(0.5)


def drawn(script, timeout=90):
    """A `before` for shoot(): wait until the page's own script says it has drawn (a loaded machine answers late)."""
    def wait(driver):
        t0 = time.time()
        while time.time() - t0 < timeout and not driver.execute_script(script):
            time.sleep(0.3)
    return wait


def shoot_tools(driver, url, run: str, imported: str) -> None:
    """web-sql.png, web-flame.png (an imported trace's Python stacks), web-timeline-tools.png and
    web-memory-lifetimes.png (the imported trace's allocations paired with frees)."""
    shoot(driver, f"{url}/sql?run={run}", "sql", run_query)
    shoot(driver, f"{url}/flame?run={imported}", "flame",
          drawn("return !!(window.opscopeFlame && window.opscopeFlame.state()) && "
                "!!document.querySelector('#flame-table .ag-row');"))
    shoot(driver, f"{url}/timeline?run={run}&step=1", "timeline-tools", timeline_tools)
    shoot(driver, f"{url}/memory?run={imported}", "memory-lifetimes",
          drawn("var g = document.querySelector('#memory-lifetimes-graph .js-plotly-plot'), "
                "m = document.querySelector('#memory-graph .js-plotly-plot');"
                "return !!(g && g.data && g.data.length && m && m.data && m.data.length) && "
                "!!document.querySelector('#memory-sites .ag-row');"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reuse", action="store_true", help="use the runs already in $OPSCOPE_HOME")
    ap.add_argument("--only", default="", help="comma-separated groups to render: pages, train, ranks, import, region, "
                                               "tools")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(","))) or {"pages", "train", "ranks", "import", "region", "tools"}
    if not args.reuse:
        os.environ["OPSCOPE_HOME"] = tempfile.mkdtemp(prefix="opscope-shots-")
    from opscope.app.web.server import create_app, start_in_thread
    from opscope.profiler.store import RunStore
    if "pages" in only:
        if args.reuse:
            runs = [r for r in RunStore().list_runs() if r["status"] == "ok" and r["engine"] != "import"]
            a, b = runs[-1]["run_id"], runs[-2]["run_id"] if len(runs) > 1 else runs[-1]["run_id"]
        else:
            a, b = make_runs()
        gpu = kineto_gpu_run()
    if "train" in only:
        done = [r["run_id"] for r in RunStore().list_runs() if r["status"] == "ok"
                and (r.get("config") or {}).get("train", {}).get("memory_timeline")] if args.reuse else []
        trained = done[0] if done else train_run()
    if "ranks" in only:
        ranks, optimized = ranks_and_optimize_runs()
    if "import" in only or "tools" in only:
        imported = torch_profiler_import()
    if "tools" in only and "pages" not in only:
        from opscope.profiler import profile
        a = profile("demo:gpt", "sim:npu-a1", steps=2)
    if "region" in only:
        region = stack_region_run()
    token = secrets.token_urlsafe()          # as `opscope serve` does; the pages strip it from the address bar
    app = create_app(token=token)
    srv, url = start_in_thread(app)
    driver = chromium()
    try:
        driver.get(f"{url}/?token={token}")  # sets the cookie every page below then passes by
        if "train" in only:
            shoot(driver, f"{url}/timeline?run={trained}&step=1", "train-timeline", click_backward(trained))
            shoot(driver, f"{url}/memory?run={trained}", "train-memory")
        if "ranks" in only:
            shoot_ranks_and_optimize(driver, url, ranks, optimized)
        if "import" in only:        # annotations, ops, Python stacks and live bytes; a step, so ops are wide
            # nothing selected: the page as a user first sees the imported trace (a selection hides the colours)
            shoot(driver, f"{url}/timeline?run={imported}&step=1", "timeline-import")
        if "region" in only:        # a compiler stack's region with its per-op children beneath it
            shoot(driver, f"{url}/timeline?run={region}&step=1", "timeline-region", click_child(region))
        if "tools" in only:         # the SQL console, the flame graph, the timeline's tools, allocation lifetimes
            shoot_tools(driver, url, a, imported)
        if "pages" not in only:
            return 0
        shoot(driver, f"{url}/", "runs", click_cell("runs-table"))
        shoot(driver, f"{url}/timeline?run={a}&step=1", "timeline", click_span)    # one step: ops, not idle
        shoot(driver, f"{url}/timeline?run={a}&find=linear", "timeline-find", find_next())
        shoot(driver, f"{url}/timeline?run={gpu}", "timeline-gpu", click_span)
        shoot(driver, f"{url}/operators?run={a}", "operators", click_cell("ops-table"))
        shoot(driver, f"{url}/memory?run={a}", "memory")
        shoot(driver, f"{url}/compare?run={b}&b={a}", "compare")
        shoot(driver, f"{url}/tensors?run={a}", "tensors", click_cell("tensors-table"))
        shoot(driver, f"{url}/hardware?run={b}", "hardware")
        shoot(driver, f"{url}/advisor?run={a}", "advisor")
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        for e in errors:
            print("browser error:", e["message"], file=sys.stderr)
    finally:
        driver.quit()
        srv.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

