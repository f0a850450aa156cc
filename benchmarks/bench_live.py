"""Live timeline staleness: how long after an op ends in a running `opscope profile --web` it is drawn on the
browser's timeline, with the machine idle and with a busy loop on every core (what `stress --cpu N` does).

A real profile (runner process, collector, store) streams into a web app served from the same process, as
`profile --web` does; headless Chromium opens the timeline before the first event. The page is sampled every
50 ms: how many events the timeline has drawn (its info line: "... of N spans") and how many the header says.
An op's staleness is the first sample at which the page showed it minus the op's end on the runner's clock
(time.perf_counter_ns: CLOCK_MONOTONIC, one clock for every process of the host; the backend is a wall-clock
one so event times are on it). Rounds alternate idle and loaded (interleaved); each prints median, p95 and
max over every op of the run, and the summary the medians over rounds, with the header's staleness beside
the timeline's (issue 27's aim: the timeline within the header's, p95 < 1 s idle, < 2 s under load), and the
load average (the machine is often shared: "idle" means no busy loops of the bench's own).

Where the time goes: each span's way is time-stamped at each stage (runner -> collector: received; collector ->
store: written; the live endpoint's answer holding it; the page showing it), by wrapping the collector's and the
server's methods in this process, and each round prints the median and p95 of every stage over the spans the
live endpoint delivered (the rest came with a window answer: counted apart).

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
        stages = _watch_stages(live)
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
        _unwatch()
    ends = store.events_frame(live.run_id, columns=["end_ns"])["end_ns"]
    return {"status": status, "events": n, "timeline": staleness(ends, timeline), "header": staleness(ends, header),
            "stages": stage_breakdown(ends, stages, timeline)}


# --- where the time goes: each stage's time stamped as an op's span passes it ---------------------------------
STAGES = [("runner -> collector", "end", "received"), ("(of it: batching", "end", "batch_last_end"),
          ("sending)", "batch_last_end", "received"), ("collector -> store", "received", "stored"),
          ("arrived -> endpoint answer", "arrived", "served"), ("answer -> drawn (page, sampled)", "served", "shown")]
_PATCHED: list = []


def _watch_stages(live) -> dict:
    """Time stamps (perf_counter_ns) by event count: when the collector received a batch, when the store had it,
    when the live endpoint answered it. The collector and the server run in this process: their methods are
    wrapped here, so the product carries no timing code."""
    from opscope.app.web.data import WebData

    got = {"received": [], "stored": [], "served": [], "batch_last_end": []}
    col = live.collector
    opener, writer = col._opener, col.writer
    open_, write = opener.open, writer.write
    received = [0]

    def timed_open(frames):
        kind, msg = open_(frames)
        if kind == "batch" and msg.n:
            received[0] += msg.n
            got["received"].append((received[0], time.perf_counter_ns()))
            got["batch_last_end"].append((received[0], int(msg.events[:, 3].max())))
        return kind, msg

    def timed_write(batches):
        n = write(batches)
        got["stored"].append((writer.events, time.perf_counter_ns()))
        return n

    served = WebData.live_spans

    def timed_live_spans(self, run, since=0, origin=None, *a, **k):
        out = served(self, run, since, origin, *a, **k)
        if int(since):      # since=0: a page with nothing drawn asking whether spans came (it then asks a window)
            got["served"].append((int(since), int(since) + len(out["start"]), time.perf_counter_ns()))
        return out

    from opscope.app.pages import timeline as page
    windowed = page.window
    got["windows"] = []

    def timed_window(data, query):
        out, code = windowed(data, query)
        got["windows"].append((int(out.get("events") or 0), time.perf_counter_ns()))
        return out, code

    got["from_memory"] = hasattr(col, "tail")       # the endpoint answers from the collector's memory, not the store
    opener.open, writer.write = timed_open, timed_write
    WebData.live_spans, page.window = timed_live_spans, timed_window
    _PATCHED.extend([(WebData, "live_spans", served), (page, "window", windowed)])
    return got


def _unwatch() -> None:
    while _PATCHED:
        cls, name, f = _PATCHED.pop()
        setattr(cls, name, f)


def _first_at(counts: list[tuple[int, int]], n: int) -> np.ndarray:
    """For k = 1..n: the first time stamp at which the count reached k (int64 max where it never did)."""
    never = np.iinfo(np.int64).max
    if not counts:
        return np.full(n, never, np.int64)
    c = np.maximum.accumulate(np.array([x for x, _ in counts], np.int64))
    t = np.array([y for _, y in counts], np.int64)
    i = np.searchsorted(c, np.arange(1, n + 1), "left")
    out = np.full(n, never, np.int64)
    out[i < len(t)] = t[i[i < len(t)]]
    return out


def stage_breakdown(ends_ns, stages: dict, timeline: list) -> dict:
    """Per stage, the seconds each event spent in it (only events that reached the page by the live endpoint:
    the first window's spans come another way). "arrived" is the earlier of received-by-the-endpoint's-source
    (the collector's memory, where the endpoint reads it) and stored."""
    n = len(ends_ns)
    at = {"end": np.sort(np.asarray(ends_ns, np.int64))}
    for k in ("received", "stored", "batch_last_end"):     # batch_last_end: the end of the last op in its batch
        at[k] = _first_at(stages[k], n)
    never = np.iinfo(np.int64).max
    at["served"] = np.full(n, never, np.int64)
    for since, upto, t in stages["served"]:          # events since..upto-1 (0-based) in this answer
        part = at["served"][since:upto]
        part[part == never] = t
    at["shown"] = _first_at([(c, t) for t, c in timeline if c is not None], n)
    at["arrived"] = at["stored"] if not stages.get("from_memory") else at["received"]
    ok = np.logical_and.reduce([at[k] != never for k in ("served", "shown", "received", "stored", "batch_last_end")])
    out = {}
    for name, a, b in STAGES:
        out[name] = (at[b][ok] - at[a][ok]) / 1e9
    out["total"] = (at["shown"][ok] - at["end"][ok]) / 1e9
    # the rest came with a window answer (the page's first, or one asked again: a new op name or track)
    win = (at["served"] == never) & (at["shown"] != never)
    out["by a window answer"] = (at["shown"][win] - at["end"][win]) / 1e9
    out["windows"] = len(stages["windows"])
    return out


def _q(xs, f):
    return float(np.quantile(xs, f)) if len(xs) else float("nan")


def _stage_line(stages: dict) -> str:
    win = stages["by a window answer"]
    return ("where the time goes (median / p95 s, spans the live endpoint delivered): " + " · ".join(
        f"{k} {_q(v, 0.5):.2f} / {_q(v, 0.95):.2f}" for k, v in stages.items() if k[0] != "b" and k != "windows")
        + f"\n  spans shown by a window answer ({stages['windows']} answers): {len(win):,}, staleness median "
        f"{_q(win, 0.5):.2f} s, p95 {_q(win, 0.95):.2f} s")


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
    stages: dict[str, list] = {"idle": [], "load": []}
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    for r in range(args.repeat):
        for cond in (("idle", "load") if r % 2 == 0 else ("load", "idle")):
            out = one_round(args.model, args.backend, args.steps, cond == "load")
            tl, hd = out["timeline"], out["header"]
            res[cond].append((_q(tl, 0.5), _q(tl, 0.95), float(tl.max()) if len(tl) else float("nan"),
                              _q(hd, 0.5), _q(hd, 0.95)))
            print(f"round {r + 1} {cond:4s}: {out['events']:,} events ({out['status']}) · timeline staleness median "
                  f"{res[cond][-1][0]:5.2f} s, p95 {res[cond][-1][1]:5.2f} s, max {res[cond][-1][2]:5.2f} s · "
                  f"header median {res[cond][-1][3]:5.2f} s, p95 {res[cond][-1][4]:5.2f} s · load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            print("  " + _stage_line(out["stages"]), flush=True)
            stages[cond].append(out["stages"])
    for cond, aim in (("idle", 1.0), ("load", 2.0)):
        med = [statistics.median(x[i] for x in res[cond]) for i in range(5)]
        label = "idle" if cond == "idle" else f"{os.cpu_count()} busy loops"
        ratio = med[1] / max(med[4], 1e-9)
        print(f"live timeline, {label}: staleness median {med[0]:5.2f} s, p95 {med[1]:5.2f} s "
              f"(aim < {aim:.0f} s: {'ok' if med[1] < aim else 'SLOW'}), max {med[2]:5.2f} s · header median "
              f"{med[3]:5.2f} s, p95 {med[4]:5.2f} s · timeline/header p95 {ratio:.2f}x "
              f"(aim <= 1.5x: {'ok' if ratio <= 1.5 else 'SLOW'})")
        print(f"  {label}, every round: " + _stage_line(
            {k: np.concatenate([st[k] for st in stages[cond]]) if k != "windows" else sum(st[k] for st in stages[cond])
             for k in stages[cond][0]}))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
