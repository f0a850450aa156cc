"""Live timeline staleness: how long after an op ends in a running `opscope profile --web` it is drawn on the
browser's timeline, with the machine idle and with a busy loop on every core (what `stress --cpu N` does).

A real profile (runner process, collector, store) streams into a web app served from the same process, as
`profile --web` does; headless Chromium opens the timeline before the first event. The page is sampled every
50 ms: how many events the timeline has drawn (its info line: "... of N spans") and how many the header says.
An op's staleness is the first sample at which the page showed it minus the op's end on the runner's clock
(time.perf_counter_ns: CLOCK_MONOTONIC, one clock for every process of the host; the backend is a wall-clock
one so event times are on it). Rounds alternate idle and loaded (interleaved); each prints median, p95 and
max over every op of the run, and the summary the medians over rounds, with the header's staleness beside
the timeline's (issue 27's aim: the timeline within the header's, p95 < 1 s idle, < 2 s under load).

    python benchmarks/bench_live.py             # demo:gpt on torch:cpu, 150 steps, 3 rounds of each
    python benchmarks/bench_live.py --quick     # 40 steps, 1 round of each
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

_PAGE = """var i = document.getElementById('timeline-info'), b = document.getElementById('run-badge');
return [i ? i.textContent : '', b ? b.innerText : ''];"""


def busy_loops(n: int) -> list:
    """A busy loop per core: `stress --cpu n` where it is installed, else Python loops."""
    if shutil.which("stress"):
        return [subprocess.Popen(["stress", "--cpu", str(n)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _count(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1).replace(",", "")) if m else None


def staleness(ends_ns: np.ndarray, samples: list[tuple[int, int | None]]) -> np.ndarray:
    """Seconds from each op's end to the first sample whose count included it. The k-th op to end is taken to
    be the k-th to arrive (the recorder sends in order); an op never shown (the run's tail after the last
    sample) is left out."""
    t = np.array([s for s, c in samples if c is not None], np.int64)
    c = np.array([c for s, c in samples if c is not None], np.int64)
    if not len(t):
        return np.zeros(0)
    best = np.maximum.accumulate(c)                      # a count never goes back: what had been shown by then
    ends = np.sort(ends_ns)
    first = np.searchsorted(best, np.arange(1, len(ends) + 1), "left")   # first sample showing >= k+1 events
    ok = first < len(t)
    return (t[first[ok]] - ends[ok]) / 1e9


def one_round(model: str, backend: str, steps: int, loaded: bool) -> dict:
    from opscope.app.web.browser import headless_chromium
    from opscope.app.web.server import create_app, start_in_thread
    from opscope.profiler.live import start_profile
    from opscope.profiler.store import RunStore

    store = RunStore()
    load = busy_loops(os.cpu_count() or 2) if loaded else []
    driver = headless_chromium(tempfile.mkdtemp(prefix="opscope-chrome-"))
    live = srv = None
    timeline, header = [], []
    try:
        live = start_profile(model, backend, steps=steps, store=store, hardware=False)
        srv, url = start_in_thread(create_app(store=store, live=live))
        driver.get(f"{url}/timeline?run={live.run_id}")
        deadline = time.time() + 600
        while time.time() < deadline:
            before = time.perf_counter_ns()
            info, badge = driver.execute_script(_PAGE)
            at = (before + time.perf_counter_ns()) // 2          # the page was read inside the call
            timeline.append((at, _count(r"of ([\d,]+) spans", info)))
            header.append((at, _count(r"([\d,]+) events", badge)))
            if live.poll() != "running" and timeline[-1][1] == live.events_received:
                break
            time.sleep(0.05)
        status = live.poll()
        n = live.events_received
    finally:
        for p in load:
            p.kill()
            p.wait()
        driver.quit()
        if srv:
            srv.shutdown()
        if live and live.poll() == "running":
            live.kill()
    ends = store.events_frame(live.run_id, columns=["end_ns"])["end_ns"]
    return {"status": status, "events": n, "timeline": staleness(ends, timeline), "header": staleness(ends, header)}


def _q(xs, f):
    return float(np.quantile(xs, f)) if len(xs) else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo:gpt")
    ap.add_argument("--backend", default="torch:cpu", help="a wall-clock backend: its op times are on the host's clock")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each (idle, loaded), interleaved")
    ap.add_argument("--quick", action="store_true", help="40 steps, one round of each")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeat = 40, 1
    os.environ.setdefault("OPSCOPE_HOME", tempfile.mkdtemp(prefix="opscope-bench-live-"))
    res: dict[str, list] = {"idle": [], "load": []}
    for r in range(args.repeat):
        for cond in (("idle", "load") if r % 2 == 0 else ("load", "idle")):
            out = one_round(args.model, args.backend, args.steps, cond == "load")
            tl, hd = out["timeline"], out["header"]
            res[cond].append((_q(tl, 0.5), _q(tl, 0.95), float(tl.max()) if len(tl) else float("nan"),
                              _q(hd, 0.5), _q(hd, 0.95)))
            print(f"round {r + 1} {cond:4s}: {out['events']:,} events ({out['status']}) · timeline staleness median "
                  f"{res[cond][-1][0]:5.2f} s, p95 {res[cond][-1][1]:5.2f} s, max {res[cond][-1][2]:5.2f} s · "
                  f"header median {res[cond][-1][3]:5.2f} s, p95 {res[cond][-1][4]:5.2f} s", flush=True)
    for cond, aim in (("idle", 1.0), ("load", 2.0)):
        med = [statistics.median(x[i] for x in res[cond]) for i in range(5)]
        label = "idle" if cond == "idle" else f"{os.cpu_count()} busy loops"
        print(f"live timeline, {label}: staleness median {med[0]:5.2f} s, p95 {med[1]:5.2f} s "
              f"(aim < {aim:.0f} s: {'ok' if med[1] < aim else 'SLOW'}), max {med[2]:5.2f} s · header median "
              f"{med[3]:5.2f} s, p95 {med[4]:5.2f} s · timeline/header p95 {med[1] / max(med[4], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
