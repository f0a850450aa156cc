"""Web analyzer speed on a big run: a synthetic 1M-event run opened in headless Chromium.

Prints: the server-side level-of-detail query (cold load and warm window), time to first timeline
render in a fresh browser (aim < 3 s), again once its scripts are cached, and the re-render after a
zoom (aim < 1 s), as medians; the browser side as an interleaved A/B of the figure's encoding
(base64 typed arrays, what the app sends, against plain JSON lists).

    python benchmarks/bench_web.py            # 1M events, 3 repeats
    python benchmarks/bench_web.py --quick    # 100k events, 1 repeat (smoke run)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OPS = ["linear", "matmul", "layer_norm", "gelu", "add", "softmax", "scaled_dot_product_attention", "transfer",
       "view", "mul"]


def synthetic_run(store, n: int, seed: int = 0, status: str = "ok") -> str:
    """A run of n events on two tracks (an NPU and its numpy fallback), durations log-normal."""
    rng = np.random.default_rng(seed)
    rid = store.create_run(model="synthetic", backend="sim:npu-a1", device="npu",
                           description={"name": "npu-a1", "peak_flops": {"float32": 6.4e13},
                                        "memory_bandwidth": 1.6e12})
    batch = 250_000
    t = 0
    for lo in range(0, n, batch):
        m = min(batch, n - lo)
        op = rng.integers(0, len(OPS), m)
        dur = np.maximum(rng.lognormal(7.5, 1.3, m), 50).astype(np.int64)   # ~2 us median, a long tail
        gap = rng.integers(20, 400, m)
        start = t + np.cumsum(gap + dur) - dur
        t = int(start[-1] + dur[-1])
        fallback = op == 3
        names = np.array(OPS, dtype=object)[op]
        store.add_event_columns(rid, {
            "step": np.zeros(m, np.int64), "seq": np.arange(lo, lo + m), "op": names,
            "node": names, "module": np.full(m, "model.layers.0", dtype=object),
            "source": np.full(m, "model.py:42", dtype=object),
            "backend": np.where(fallback, "numpy", "npu-a1").astype(object),
            "device": np.where(fallback, "cpu", "npu").astype(object), "thread": np.ones(m, np.int64),
            "depth": np.zeros(m, np.int64), "start_ns": start, "end_ns": start + dur,
            "input_shapes": np.full(m, "[[2,128,256]]", dtype=object),
            "input_dtypes": np.full(m, '["float32"]', dtype=object),
            "output_shapes": np.full(m, "[[2,128,256]]", dtype=object),
            "output_dtypes": np.full(m, '["float32"]', dtype=object),
            "bytes": rng.integers(1 << 10, 1 << 22, m), "flops": rng.integers(1 << 10, 1 << 26, m),
            "fallback": fallback, "live_bytes": rng.integers(1 << 20, 1 << 28, m)})
    store.finish_run(rid, status=status)
    return rid


def chromium(tmp: str):
    from opscope.app.web.browser import headless_chromium
    return headless_chromium(tmp, width=1600)


# The page is drawn when the timeline holds scattergl traces and the info line counts the spans.
_DRAWN = """var gd = document.querySelector('#timeline-graph .js-plotly-plot');
var info = document.getElementById('timeline-info');
return !!(gd && gd.data && gd.data.length && gd.data[0].type === 'scattergl' && info && info.textContent
          && info.textContent.indexOf(arguments[0]) >= 0);"""


def wait(driver, script, *args, timeout=60.0):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if driver.execute_script(script, *args):
            return time.perf_counter() - t0
        time.sleep(0.01)
    raise TimeoutError(script[:60])


def _browser_round(app, url, rid, n, out):
    """A fresh Chromium: open the timeline (cold server cache), zoom, then open it again (scripts cached)."""
    driver = chromium(tempfile.mkdtemp(prefix="opscope-chrome-"))
    try:
        driver.set_window_size(1600, 1000)
        for key in ("first", "again"):
            app.opscope_data._spans.clear()          # a cold server cache each time: the first open of a run
            t0 = time.perf_counter()
            driver.get(f"{url}/timeline?run={rid}")
            wait(driver, _DRAWN, f"of {n:,} spans")
            out[key].append(time.perf_counter() - t0)
            if key == "first":
                before = driver.execute_script("return document.getElementById('timeline-info').textContent")
                t0 = time.perf_counter()
                driver.execute_script("""var gd = document.querySelector('#timeline-graph .js-plotly-plot');
                    var r = gd.layout.xaxis.range, m = (r[0] + r[1]) / 2, w = (r[1] - r[0]) / 200;
                    Plotly.relayout(gd, {'xaxis.range[0]': m - w, 'xaxis.range[1]': m + w});""")
                wait(driver, "return document.getElementById('timeline-info').textContent !== arguments[0];", before)
                out["zoom"].append(time.perf_counter() - t0)
        severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        if severe:
            print("browser errors:", severe, file=sys.stderr)
    finally:
        driver.quit()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k events, one repeat")
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    n = args.events or (100_000 if args.quick else 1_000_000)
    repeat = 1 if args.quick else args.repeat
    tmp = tempfile.mkdtemp(prefix="opscope-bench-web-")
    os.environ["OPSCOPE_HOME"] = tmp
    from opscope.app.web import timeline as lod
    from opscope.app.web.data import WebData
    from opscope.app.web.server import create_app, start_in_thread
    from opscope.profiler.store import RunStore

    store = RunStore(Path(tmp) / "runs.duckdb")
    t0 = time.perf_counter()
    rid = synthetic_run(store, n)
    print(f"synthetic run: {n:,} events inserted in {time.perf_counter() - t0:.1f} s")

    data = WebData(store)
    cold, warm_full, warm_zoom = [], [], []
    for _ in range(repeat):
        data._spans.clear()
        run = data.run(rid)
        t0 = time.perf_counter()
        spans = data.spans(run)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fig = lod.figure(spans, lod.level_of_detail(spans, spans.t_min, spans.t_max))
        warm_full.append(time.perf_counter() - t0)
        mid, w = (spans.t_min + spans.t_max) // 2, (spans.t_max - spans.t_min) // 1000
        t0 = time.perf_counter()
        view = lod.level_of_detail(spans, mid - w, mid + w)
        lod.figure(spans, view)
        warm_zoom.append(time.perf_counter() - t0)
    pts = sum(len(lod.untyped(tr["x"])) for tr in fig["data"]) // 4
    print(f"server: load + intern spans (cold) {statistics.median(cold) * 1e3:8.1f} ms")
    print(f"server: LOD + figure, whole run    {statistics.median(warm_full) * 1e3:8.1f} ms  ({pts:,} segments drawn)")
    print(f"server: LOD + figure, 0.1% window  {statistics.median(warm_zoom) * 1e3:8.1f} ms")

    app = create_app(store=store)
    srv, url = start_in_thread(app)
    typed = lod.typed
    # A/B, interleaved: the figure as base64 typed arrays (what the app sends) against plain JSON lists
    # (what it sent before); the page, server and browser are otherwise the same.
    modes = {"typed arrays": typed, "JSON lists": lambda a, dtype: np.asarray(a, dtype=dtype).tolist()}
    res = {m: {"first": [], "again": [], "zoom": []} for m in modes}
    try:
        for i in range(repeat):
            for mode, encode in (modes.items() if i % 2 == 0 else reversed(modes.items())):
                lod.typed = encode
                _browser_round(app, url, rid, n, res[mode])
    finally:
        lod.typed = typed
        srv.shutdown()
    for mode, r in res.items():
        f, a, z = (statistics.median(r[k]) for k in ("first", "again", "zoom"))
        print(f"browser ({mode}): first timeline render {f:6.2f} s (aim < 3 s: {'ok' if f < 3 else 'SLOW'}) · "
              f"again, scripts cached {a:6.2f} s · zoom re-render {z:6.2f} s (aim < 1 s: {'ok' if z < 1 else 'SLOW'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
