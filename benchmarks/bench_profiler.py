"""Profiler overhead and throughput, side by side in one process (medians, ratios).

    python benchmarks/bench_profiler.py [--quick]

(a) demo:gpt forward on torch:cpu: opscope's executor without hooks vs with the profiler's
    recorder, and eager PyTorch without vs under torch.profiler (CPU, record_shapes=True), and
    under opscope's eager engine (dispatch mode). Runs are interleaved so load drifts hit all sides.
(b) events per second through the stream (ZeroMQ) into the store.
(d) the per-op aggregate query on 1M events.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch


class NullSink:
    """Keeps batches in memory: measures the recorder, not the stream."""

    def __init__(self):
        self.events = 0

    def send(self, batch):
        self.events += batch.n
        return True


def bench_overhead(reps: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from opscope.profiler.eager import EagerProfiler
    from opscope.profiler.recorder import Recorder
    from opscope.runtime import open_session
    torch.set_num_threads(1)
    s = open_session("demo:gpt", "torch:cpu")
    model, inputs = s.model, s.inputs
    rec = Recorder(NullSink())
    eager_prof = EagerProfiler(NullSink()).watch(model)

    def graph_plain():
        s.run()

    def graph_hooked():
        with s.executor.hooked(rec):
            s.run()

    def eager_plain():
        with torch.no_grad():
            model(*inputs)

    def eager_torch_profiler():
        with torch.no_grad(), torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            model(*inputs)

    def eager_opscope():
        with torch.no_grad():
            eager_prof.run_step(lambda: model(*inputs))

    sides = {"graph": graph_plain, "graph+opscope": graph_hooked, "eager": eager_plain,
             "eager+torch.profiler": eager_torch_profiler, "eager+opscope": eager_opscope}
    for f in sides.values():            # warm-up: first-call allocations, lazy init
        f()
        f()
    times = {k: [] for k in sides}
    for _ in range(reps):
        for k, f in sides.items():      # interleaved
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ov_graph = med["graph+opscope"] / med["graph"] - 1
    ov_tp = med["eager+torch.profiler"] / med["eager"] - 1
    ov_eager = med["eager+opscope"] / med["eager"] - 1
    print(f"(a) demo:gpt forward, torch:cpu, median of {reps} (1 thread)")
    for k, v in med.items():
        print(f"    {k:24s} {v * 1e3:8.2f} ms")
    print(f"    overhead: opscope graph hooks {100 * ov_graph:+.1f}%, opscope eager engine {100 * ov_eager:+.1f}%, "
          f"torch.profiler {100 * ov_tp:+.1f}%")
    if ov_tp > 0:
        print(f"    opscope hooks / torch.profiler overhead = {ov_graph / ov_tp:.2f} (aim < 0.5); "
              f"eager engine / torch.profiler = {ov_eager / ov_tp:.2f}")
    return med


def _sites(k):
    return [(i, f"op{i % 7}", f"node_{i}", f"layer.{i % 4}", "model.py:1", "torch:cpu", "cpu", 0, "[[2,128,256]]",
             '["float32"]', "[[2,128,256]]", '["float32"]', 262144, 1 << 20, False, 262144, 0) for i in range(k)]


def bench_stream(total: int) -> float:
    from opscope.profiler.batch import Batch
    from opscope.profiler.store import RunStore
    from opscope.profiler.stream import Collector, StreamSink
    store = RunStore(os.path.join(tempfile.mkdtemp(), "bench.duckdb"))
    run = store.create_run(model="bench", backend="torch:cpu")
    col = Collector(store, run, hwm=1000).start()
    sink = StreamSink(col.endpoint, hwm=1000)
    per, nsites = 4096, 100
    t0 = time.perf_counter()
    sent = 0
    step = 0
    while sent < total:
        n = min(per, total - sent)
        ev = np.empty((n, 5), np.int64)
        ev[:, 0] = np.arange(n) % nsites
        ev[:, 1] = np.arange(n)
        ev[:, 2] = np.arange(n) * 1000
        ev[:, 3] = ev[:, 2] + 500
        ev[:, 4] = 0
        sink.send(Batch(step, 1, _sites(nsites) if step == 0 else [], ev))
        sent += n
        step += 1
    sink.control("end", status="ok")
    col.ended.wait(600)
    col.stop()
    dt = time.perf_counter() - t0
    stored = store.get_run(run)["events"]
    rate = stored / dt
    print(f"(b) stream -> store: {stored} events stored, {sink.dropped} dropped, in {dt:.2f} s = "
          f"{rate / 1e3:.0f}k events/s (aim >= 200k/s)")
    return rate


def bench_query(total: int) -> float:
    from opscope.profiler.batch import Batch, BatchWriter
    from opscope.profiler.store import RunStore
    store = RunStore(os.path.join(tempfile.mkdtemp(), "bench.duckdb"))
    run = store.create_run(model="bench", backend="torch:cpu")
    w = BatchWriter(store, run)
    rng = np.random.default_rng(0)
    ev = np.empty((total, 5), np.int64)
    ev[:, 0] = rng.integers(0, 100, total)
    ev[:, 1] = np.arange(total)
    ev[:, 2] = np.arange(total) * 1000
    ev[:, 3] = ev[:, 2] + rng.integers(100, 900, total)
    ev[:, 4] = 0
    t0 = time.perf_counter()
    w.write([Batch(0, 1, _sites(100), ev)])
    ins = time.perf_counter() - t0
    times = []
    for by in ("op", "module", "node") * 2:
        t0 = time.perf_counter()
        store.op_stats(run, by=by)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"(d) per-op aggregates on {total} events: median {med:.3f} s (aim <= 0.5 s); "
          f"bulk insert {ins:.2f} s = {total / ins / 1e3:.0f}k events/s")
    return med


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer repetitions, fewer events")
    a = p.parse_args(argv)
    bench_overhead(5 if a.quick else 30)
    bench_stream(200_000 if a.quick else 1_000_000)
    bench_query(200_000 if a.quick else 1_000_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
