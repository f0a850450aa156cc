"""Profiler overhead and throughput, side by side in one process (medians, ratios).

    python benchmarks/bench_profiler.py [--quick]

(a) demo:gpt forward on torch:cpu: opscope's executor without hooks vs with the profiler's
    recorder, and eager PyTorch without vs under torch.profiler (CPU, record_shapes=True), and
    under opscope's eager engine (dispatch mode). Runs are interleaved so load drifts hit all sides.
(b) events per second through the stream (ZeroMQ) into the store, and what the wire format (msgpack
    header, raw int64 events, HMAC-SHA256 checked on every message) costs per event on both ends.
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

from harness import NullSink




def bench_overhead(reps: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from torch.utils._python_dispatch import TorchDispatchMode

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

    class NoopMode(TorchDispatchMode):
        """The floor of any dispatch-mode engine: intercept every ATen op, record nothing."""
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def eager_noop_mode():
        with torch.no_grad(), NoopMode():
            model(*inputs)

    sides = {"graph": graph_plain, "graph+opscope": graph_hooked, "eager": eager_plain,
             "eager+torch.profiler": eager_torch_profiler, "eager+opscope": eager_opscope,
             "eager+no-op dispatch mode": eager_noop_mode}
    for f in sides.values():            # warm-up: first-call allocations, lazy init
        f()
        f()
    wall = {k: [] for k in sides}
    cpu = {k: [] for k in sides}        # this thread's CPU time: what other processes on a shared box move least
    for _ in range(reps):
        for k, f in sides.items():      # interleaved
            c0, t0 = time.thread_time(), time.perf_counter()
            f()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.thread_time() - c0)
    print(f"(a) demo:gpt forward, torch:cpu, median of {reps} (1 thread), wall and CPU time")
    for clock, times in (("wall", wall), ("cpu", cpu)):
        med = {k: statistics.median(v) for k, v in times.items()}
        ov = {k: med[k] / med["graph" if k.startswith("graph") else "eager"] - 1 for k in med}
        print(f"  {clock}: " + ", ".join(f"{k} {v * 1e3:.2f} ms ({100 * ov[k]:+.1f}%)" for k, v in med.items()))
        tp = ov["eager+torch.profiler"]
        if tp > 0:
            print(f"  {clock}: overhead / torch.profiler's: opscope graph hooks {ov['graph+opscope'] / tp:.2f} "
                  f"(aim < 0.5); eager engine {ov['eager+opscope'] / tp:.2f}; "
                  f"no-op dispatch mode {ov['eager+no-op dispatch mode'] / tp:.2f}")
    return wall


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
    sink = StreamSink(col.endpoint, col.key, hwm=1000)
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
    sink.end("ok")
    col.ended.wait(600)
    col.stop()
    dt = time.perf_counter() - t0
    stored = store.get_run(run)["events"]
    rate = stored / dt
    print(f"(b) stream -> store: {stored} events stored, {sink.dropped} dropped, in {dt:.2f} s = "
          f"{rate / 1e3:.0f}k events/s (aim >= 200k/s)")
    return rate


def bench_wire(reps: int) -> float:
    """Seal (runner) + open (collector) of one 4096-event batch, CPU time: the stream's security cost."""
    from opscope.profiler.batch import Batch
    from opscope.profiler.wire import Opener, Sealer, new_key
    key = new_key()
    sealer, opener = Sealer(key), Opener(key)
    ev = np.arange(4096 * 5, dtype=np.int64).reshape(4096, 5)
    batch = Batch(0, 1, [], ev)
    times = []
    for _ in range(reps):
        c0 = time.thread_time()
        opener.open([bytes(f) for f in sealer.batch(batch)])
        times.append(time.thread_time() - c0)
    per = statistics.median(times) / len(ev)
    print(f"    wire format: {per * 1e9:.0f} ns of CPU per event (seal + check + decode, both ends together)")
    return per


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

    def timed(by):
        t0 = time.perf_counter()
        store.op_stats(run, by=by)
        return time.perf_counter() - t0

    live = statistics.median(timed("op") for _ in range(3))         # a running run: aggregated live
    t0 = time.perf_counter()
    store.finish_run(run)                                            # computes the per-op table once
    fin = time.perf_counter() - t0
    cold = {by: timed(by) for by in ("op", "module", "node")}       # op: cached at finish; others: first query
    warm = statistics.median(timed(by) for by in ("op", "module", "node") * 3)
    print(f"(d) per-op aggregates on {total} events (aim <= 0.5 s): running run (live SQL) median {live:.3f} s; "
          f"finish_run {fin:.3f} s; finished run first query "
          + ", ".join(f"by {k} {v:.3f} s" for k, v in cold.items()) + f"; warm median {warm:.3f} s; "
          f"bulk insert {ins:.2f} s = {total / ins / 1e3:.0f}k events/s")
    return max(live, *cold.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer repetitions, fewer events")
    a = p.parse_args(argv)
    bench_overhead(5 if a.quick else 30)
    bench_stream(200_000 if a.quick else 1_000_000)
    bench_wire(50 if a.quick else 500)
    bench_query(200_000 if a.quick else 1_000_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
