"""Web analyzer speed on a big run: a synthetic 1M-event run opened in headless Chromium.

Prints: the live poll's answer time while a collector thread writes into the store of the same process
and busy loops hold every core (against the poll's 1 s interval), the server-side level-of-detail query (cold load and warm window), time to first timeline
render in a fresh browser, again once its scripts are cached, and the re-render after a
zoom (aim < 1 s: the server's detail for the new window drawn), as medians; then, interleaved, idle and with a
busy loop on every core (the machine's load average printed with each): the first render (issue 38's aim:
< 2 s), the Advisor page's first visit until its advice shows (aim < 5 s) and the Compare page of two such runs until its table shows (aim < 3 s). The runs are stored as
`profile` and `trace import` store them: their op stats, times and analyses computed then (profiler/kept.py; the
time that takes is printed), so a first visit reads them. `--cold` also times the Advisor with nothing kept.
The live timeline's staleness is benchmarks/bench_live.py.

    python benchmarks/bench_web.py            # 1M events, 3 repeats
    python benchmarks/bench_web.py --quick    # 100k events, 1 repeat (smoke run)
    python benchmarks/bench_web.py --live     # only the live poll
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
import orjson
import plotly.io

OPS = ["linear", "matmul", "layer_norm", "gelu", "add", "softmax", "scaled_dot_product_attention", "transfer",
       "view", "mul"]


def synthetic_run(store, n: int, seed: int = 0, status: str = "ok") -> str:
    """A run of n events on two tracks (an NPU and its numpy fallback), durations log-normal."""
    rng = np.random.default_rng(seed)
    from opscope.runtime.backends import describe
    # the chip's whole description, as a profile stores it (the advisor reads every field of it)
    rid = store.create_run(model="synthetic", backend="sim:npu-a1", device="npu",
                           description=describe("sim:npu-a1")[0].as_dict())
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


def live_poll(seconds: float = 8.0) -> None:
    """The header's poll while a run streams in: a writer thread inserts batches the way the collector does
    (same process, same store), busy loops hold both cores, and a client asks /_opscope/live every 100 ms.
    Beside it, what the poll cost before: the run's row and a count(*) of its events from the store."""
    import subprocess
    import threading
    import urllib.request

    from opscope.app.web.server import LIVE_ENDPOINT, create_app, start_in_thread
    from opscope.profiler.store import RunStore

    store = RunStore()
    rid = store.create_run(model="synthetic", backend="npu-a1", device="sim:npu-a1")

    class Live:                      # what the web app reads of a LiveRun: the collector's counters
        run_id, events_received, dropped = rid, 0, 0

        @staticmethod
        def poll():
            return "running"
    live = Live()
    stop = threading.Event()

    def collector():
        n, t = 2000, 0
        while not stop.is_set():
            start = t + np.arange(n) * 1000
            store.add_event_columns(rid, {
                "step": np.zeros(n, np.int64), "seq": np.arange(n), "op": np.full(n, "linear", dtype=object),
                "node": np.full(n, "linear", dtype=object), "module": np.full(n, "", dtype=object),
                "source": np.full(n, "", dtype=object), "backend": np.full(n, "npu-a1", dtype=object),
                "device": np.full(n, "sim:npu-a1", dtype=object), "thread": np.ones(n, np.int64),
                "depth": np.zeros(n, np.int64), "start_ns": start, "end_ns": start + 800,
                "input_shapes": np.full(n, "[]", dtype=object), "input_dtypes": np.full(n, "[]", dtype=object),
                "output_shapes": np.full(n, "[]", dtype=object), "output_dtypes": np.full(n, "[]", dtype=object),
                "bytes": np.zeros(n, np.int64), "flops": np.zeros(n, np.int64), "fallback": np.zeros(n, bool),
                "live_bytes": np.zeros(n, np.int64)})
            live.events_received += n
            t = int(start[-1]) + 1000
            time.sleep(0.25)          # the collector's write interval

    app = create_app(store=store, live=live)
    srv, url = start_in_thread(app)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    writer = threading.Thread(target=collector, daemon=True)
    writer.start()
    new, old = [], []
    try:
        t_end = time.time() + seconds
        while time.time() < t_end:
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"{url}{LIVE_ENDPOINT}?run={rid}") as r:
                r.read()
            new.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run = store.get_run(rid)
            store.query("SELECT count(*) FROM events WHERE run_id = ?", [run["run_id"]])
            old.append(time.perf_counter() - t0)
            time.sleep(0.1)
    finally:
        stop.set()
        writer.join()
        for p in load:
            p.kill()
        srv.shutdown()
    q = (lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] * 1e3)
    print(f"live poll, collector writing, {len(load)} busy loops: /_opscope/live median {q(new, 0.5):6.1f} ms, "
          f"p95 {q(new, 0.95):6.1f} ms, max {max(new) * 1e3:6.1f} ms (interval 1000 ms) · "
          f"before (run row + count(*) from the store) median {q(old, 0.5):6.1f} ms, p95 {q(old, 0.95):6.1f} ms "
          f"({live.events_received:,} events written)")


def chromium(tmp: str):
    from opscope.app.web.browser import headless_chromium
    return headless_chromium(tmp, width=1600)


# The page is drawn when the canvas has painted a window and the info line counts the spans.
_DRAWN = """var s = window.opscopeTimeline && window.opscopeTimeline.state();
var info = document.getElementById('timeline-info');
return !!(s && s.draws && s.shown && info && info.textContent.indexOf(arguments[0]) >= 0);"""

# A zoom is re-rendered when the server's level of detail for the new window is drawn (the canvas
# redraws the spans it holds at once; this waits for the detail).
_ZOOMED = """var s = window.opscopeTimeline.state();
return !!(s.shown && !s.busy && Math.abs(s.shown[0] - arguments[0]) <= 1 && Math.abs(s.shown[1] - arguments[1]) <= 1
          && document.getElementById('timeline-info').textContent !== arguments[2]);"""


def wait(driver, script, *args, timeout=60.0):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if driver.execute_script(script, *args):
            return time.perf_counter() - t0
        time.sleep(0.005)
    raise TimeoutError(script[:60])


# The other side: the same window drawn by plotly.js scattergl (what the timeline used before its own
# canvas), one trace of line segments per op, in the same page. Both sides are timed to the frame
# after the call (a requestAnimationFrame), interleaved. Returns [plotly ms, opscope ms].
_DRAW_AB = """var done = arguments[arguments.length - 1];
var api = window.opscopeTimeline, s = api.state(), q = 'run=' + arguments[0] + '&px=1400&t0=' + s.shown[0] + '&t1=' + s.shown[1];
function frame() { return new Promise(function (ok) { requestAnimationFrame(function () { setTimeout(ok, 0); }); }); }
function b64(t, T) { var x = atob(t), u = new Uint8Array(x.length); for (var i = 0; i < x.length; i++) u[i] = x.charCodeAt(i); return new T(u.buffer); }
Promise.resolve(window.Plotly).then(function () { return fetch('/_opscope/timeline?' + q); }).then(function (r) { return r.json(); })
.then(async function (p) {
  var by = {}, parts = [['spans', p.spans], ['buckets', p.buckets]];
  parts.forEach(function (kv) { var d = kv[1], st = b64(d.start, Float64Array), en = b64(d.end, Float64Array),
    tr = b64(d.track, Int32Array), lb = kv[0] === 'spans' ? b64(d.label, Int32Array) : null;
    for (var i = 0; i < d.n; i++) { var k = lb ? p.names[lb[i]] : 'too small', t = by[k] || (by[k] = {x: [], y: []});
      t.x.push(st[i] / 1e6, (st[i] + en[i]) / 2e6, en[i] / 1e6, NaN); t.y.push(tr[i], tr[i], tr[i], NaN); } });
  var traces = Object.keys(by).map(function (k) { return {type: 'scattergl', mode: 'lines', name: k, x: by[k].x, y: by[k].y,
    line: {width: 22}, connectgaps: false}; });
  var div = document.createElement('div'); div.style.width = '1500px'; div.style.height = '300px';
  document.body.appendChild(div);
  var out = [[], []];
  for (var r = 0; r < 5; r++) {
    var t0 = performance.now();
    await window.Plotly.newPlot(div, traces, {xaxis: {range: [s.t0 / 1e6, s.t1 / 1e6]}, showlegend: true});
    await frame(); out[0].push(performance.now() - t0);
    window.Plotly.purge(div);
    t0 = performance.now(); api.setView(s.t0, s.t1 - 1e-6); await frame(); out[1].push(performance.now() - t0);
  }
  div.remove();
  done(out.map(function (xs) { xs.sort(function (a, b) { return a - b; }); return xs[2]; }));
}).catch(function (e) { done(String(e)); });"""


def _browser_round(app, url, rid, n, out):
    """A fresh Chromium: open the timeline (cold server cache), zoom twice, then open it again (scripts cached)."""
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
                for frac in (1 / 200, 1 / 20):      # a deep zoom, then out again a bit
                    before = driver.execute_script("return document.getElementById('timeline-info').textContent")
                    w = driver.execute_script("""var s = window.opscopeTimeline.state(), m = (s.t0 + s.t1) / 2,
                        w = (s.t1 - s.t0) * arguments[0]; return [Math.floor(m - w / 2), Math.ceil(m + w / 2)];""", frac)
                    t0 = time.perf_counter()
                    driver.execute_script("window.opscopeTimeline.setView(arguments[0], arguments[1]);", *w)
                    wait(driver, _ZOOMED, w[0], w[1], before)
                    out["zoom"].append(time.perf_counter() - t0)
                driver.set_script_timeout(60)
                ab = driver.execute_async_script(_DRAW_AB, rid)
                if isinstance(ab, list):
                    out["draw_plotly"].append(ab[0])
                    out["draw_opscope"].append(ab[1])
                else:
                    print("draw A/B failed:", ab, file=sys.stderr)
        severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        if severe:
            print("browser errors:", severe, file=sys.stderr)
    finally:
        driver.quit()


_COMPARED = """var t = document.getElementById('compare-table'), s = document.getElementById('compare-summary');
return !!(s && s.textContent.indexOf('B / A per step') >= 0 && t && t.querySelectorAll('.ag-row').length > 0);"""

_ADVICE_SHOWN = """var e = document.getElementById('advisor-list');
return !!(e && e.textContent.length && e.textContent.indexOf('loading') < 0);"""


def page_seconds(url: str, shown: str, *args, loaded: bool, timeout: float = 600) -> float:
    """Seconds from a fresh Chromium opening `url` until the script `shown` holds; with busy loops on every core
    when `loaded` (each page below is timed this way)."""
    load = busy_loops(loaded)
    driver = chromium(tempfile.mkdtemp(prefix="opscope-chrome-"))
    try:
        t0 = time.perf_counter()
        driver.get(url)
        wait(driver, shown, *args, timeout=timeout)
        return time.perf_counter() - t0
    finally:
        driver.quit()
        for p in load:
            p.kill()
            p.wait()


def first_render(app, url, rid, n, loaded: bool) -> float:
    """The timeline of a run no page has opened yet."""
    app.opscope_data._spans.clear()
    return page_seconds(f"{url}/timeline?run={rid}", _DRAWN, f"of {n:,} spans", loaded=loaded, timeout=60)


def busy_loops(loaded: bool) -> list:
    import subprocess
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)] \
        if loaded else []


def compare_page(url, a, b, loaded: bool) -> float:
    """The Compare page of two runs until its summary and table show."""
    return page_seconds(f"{url}/compare?run={a}&b={b}", _COMPARED, loaded=loaded)


def advisor_page(store, url, rid, cold: bool, loaded: bool = False) -> float:
    """The Advisor page until its advice shows; cold: nothing kept in the store for the run."""
    from opscope.profiler.advisor import ANALYSES_ARTIFACT
    if cold:
        with store.connect() as con:
            con.execute("DELETE FROM artifacts WHERE run_id = ? AND kind = ?", [rid, ANALYSES_ARTIFACT])
    return page_seconds(f"{url}/advisor?run={rid}", _ADVICE_SHOWN, loaded=loaded)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k events, one repeat")
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--live", action="store_true", help="only the live poll under load")
    ap.add_argument("--cold", action="store_true", help="also the Advisor's visit with nothing kept (slow)")
    args = ap.parse_args(argv)
    n = args.events or (100_000 if args.quick else 1_000_000)
    repeat = 1 if args.quick else args.repeat
    tmp = tempfile.mkdtemp(prefix="opscope-bench-web-")
    os.environ["OPSCOPE_HOME"] = tmp
    from opscope.app.web import timeline as lod
    from opscope.app.web.data import WebData
    from opscope.app.web.server import create_app, start_in_thread
    from opscope.profiler.store import RunStore

    live_poll(4.0 if args.quick else 8.0)
    if args.live:
        return 0
    store = RunStore(Path(tmp) / "runs.duckdb")
    t0 = time.perf_counter()
    rid = synthetic_run(store, n)
    print(f"synthetic run: {n:,} events inserted in {time.perf_counter() - t0:.1f} s")
    from opscope.profiler.kept import when_stored
    t0 = time.perf_counter()
    when_stored(store, rid, force=True)          # as `profile` and `trace import` store a run
    print(f"stored: op stats, times and analyses computed in {time.perf_counter() - t0:.1f} s (once per run)")
    rid_b = synthetic_run(store, n, seed=1)
    when_stored(store, rid_b, force=True)

    data = WebData(store)
    cold, warm_full, warm_zoom, warm_find = [], [], [], []
    for _ in range(repeat):
        data._spans.clear()
        run = data.run(rid)
        t0 = time.perf_counter()
        spans = data.spans(run)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        view = lod.level_of_detail(spans, spans.t_min, spans.t_max)
        body = orjson.dumps(lod.payload(spans, view))
        warm_full.append(time.perf_counter() - t0)
        mid, w = (spans.t_min + spans.t_max) // 2, (spans.t_max - spans.t_min) // 1000
        t0 = time.perf_counter()
        orjson.dumps(lod.payload(spans, lod.level_of_detail(spans, mid - w, mid + w)))
        warm_zoom.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        match = lod.matching(spans, "softmax")
        found = lod.level_of_detail(spans, spans.t_min, spans.t_max, match=match)
        orjson.dumps(lod.payload(spans, found))
        lod.next_match(spans, match, mid)
        warm_find.append(time.perf_counter() - t0)
    from opscope.app.pages import memory
    t0 = time.perf_counter()
    mem = plotly.io.to_json(memory.figure(data.memory_series(rid)), validate=False)     # as Dash sends it
    t_mem = time.perf_counter() - t0
    print(f"server: load + intern spans (cold) {statistics.median(cold) * 1e3:8.1f} ms")
    print(f"server: LOD + payload, whole run   {statistics.median(warm_full) * 1e3:8.1f} ms  "
          f"({len(view.shown):,} spans + {len(view.b_track):,} buckets, {len(body) / 1e3:.0f} kB)")
    print(f"server: LOD + payload, 0.1% window {statistics.median(warm_zoom) * 1e3:8.1f} ms")
    print(f"server: search 'softmax', whole run + next match {statistics.median(warm_find) * 1e3:8.1f} ms "
          f"({found.hits:,} matches)")
    print(f"server: memory chart of the run        {t_mem * 1e3:8.1f} ms  ({len(mem) / 1e3:.0f} kB for {n:,} samples)")

    app = create_app(store=store)
    srv, url = start_in_thread(app)
    res = {"first": [], "again": [], "zoom": [], "draw_plotly": [], "draw_opscope": [], "first_idle": [],
           "first_load": [], "advisor_cold": [], "advisor_idle": [], "advisor_load": [], "compare_idle": [],
           "compare_load": []}
    # The machine's load average (1 min) as each page was opened: on a shared machine the numbers are this load's.
    loads = {"first": [], "advisor": [], "compare": []}
    try:
        for _ in range(repeat):
            _browser_round(app, url, rid, n, res)
        for r in range(repeat):                      # interleaved: idle then loaded, cold then kept (order flips)
            for loaded in ((False, True) if r % 2 == 0 else (True, False)):
                loads["first"].append(os.getloadavg()[0])
                res["first_load" if loaded else "first_idle"].append(first_render(app, url, rid, n, loaded))
            for loaded in ((False, True) if r % 2 == 0 else (True, False)):
                cond = "load" if loaded else "idle"
                loads["advisor"].append(os.getloadavg()[0])
                res[f"advisor_{cond}"].append(advisor_page(store, url, rid, False, loaded))
                loads["compare"].append(os.getloadavg()[0])
                res[f"compare_{cond}"].append(compare_page(url, rid, rid_b, loaded))
        if args.cold:
            res["advisor_cold"].append(advisor_page(store, url, rid, True))
    finally:
        srv.shutdown()
    f, a, z = (statistics.median(res[k]) for k in ("first", "again", "zoom"))
    print(f"browser: first timeline render {f:6.2f} s (aim < 3 s: {'ok' if f < 3 else 'SLOW'}) · "
          f"again, scripts cached {a:6.2f} s · zoom re-render {z:6.2f} s (aim < 1 s: {'ok' if z < 1 else 'SLOW'})")
    if res["draw_opscope"]:
        dp, do = statistics.median(res["draw_plotly"]), statistics.median(res["draw_opscope"])
        print(f"browser: draw one window (same data, to the next frame): opscope canvas {do:7.1f} ms · "
              f"plotly.js scattergl {dp:7.1f} ms · ratio {do / dp:.2f}")
    fi, fl = statistics.median(res["first_idle"]), statistics.median(res["first_load"])
    print(f"browser: first timeline render, {n:,} events: idle {fi:6.2f} s · {os.cpu_count()} busy loops {fl:6.2f} s "
          f"(aim < 2 s: idle {'ok' if fi < 2 else 'SLOW'}, loaded {'ok' if fl < 2 else 'SLOW'}) · loaded/idle {fl / fi:.2f}x"
          f" · load average {_loads(loads['first'])}")
    for what, key, aim in (("advisor page until its advice shows, first visit", "advisor", 5),
                           (f"compare page of two {n:,}-event runs until its table shows", "compare", 3)):
        i, l = statistics.median(res[f"{key}_idle"]), statistics.median(res[f"{key}_load"])
        print(f"browser: {what}: idle {i:6.2f} s · {os.cpu_count()} busy loops {l:6.2f} s (aim < {aim} s: idle "
              f"{'ok' if i < aim else 'SLOW'}, loaded {'ok' if l < aim else 'SLOW'}) · load average {_loads(loads[key])}")
    if res["advisor_cold"]:
        print(f"browser: advisor page with nothing kept (the analyses computed on the visit) "
              f"{statistics.median(res['advisor_cold']):6.2f} s")
    return 0


def _loads(xs: list) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if xs else "?"


if __name__ == "__main__":
    sys.exit(main())
