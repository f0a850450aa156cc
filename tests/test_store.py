"""The run store: runs, columnar inserts, per-op aggregates in SQL, ids by prefix, two processes."""
import subprocess
import sys
import time

import numpy as np
import pytest

from opscope.profiler.store import RunStore
from opscope.runtime.errors import UsageError


def _row(step, seq, op, start, end, *, node=None, module="m", depth=0, thread=1, flops=100, fallback=False):
    return (step, seq, op, node or f"{op}_{seq}", module, "f.py:1", "numpy", "cpu", thread, depth, start, end,
            "[[2,3]]", '["float32"]', "[[2,3]]", '["float32"]', 24, flops, fallback, 0)


def test_run_lifecycle_and_prefix_ids():
    store = RunStore()
    a = store.create_run(model="demo:mlp", backend="numpy", device="cpu", description={"name": "numpy"})
    run = store.get_run(a[:6])
    assert run["run_id"] == a and run["status"] == "running" and run["description_hash"]
    assert set(run["versions"]) >= {"python", "torch", "numpy", "opscope"}
    store.add_events(a, [_row(0, 0, "linear", 0, 100), _row(0, 1, "relu", 100, 150)])
    store.finish_run(a, status="failed", error="boom", dropped=3)
    run = store.get_run(a)
    assert (run["status"], run["error"], run["events"], run["dropped"]) == ("failed", "boom", 2, 3)
    assert run["ended_at"] >= run["started_at"]
    b = store.create_run(model="demo:cnn", backend="sim:npu-a1")
    assert [r["run_id"] for r in store.list_runs()] == [b, a]


def test_unknown_and_ambiguous_ids_are_usage_errors():
    store = RunStore()
    with pytest.raises(UsageError, match="unknown run 'zzz'.*opscope runs"):
        store.get_run("zzz")
    store.create_run(model="m", backend="numpy", run_id="abc1")
    store.create_run(model="m", backend="numpy", run_id="abc2")
    with pytest.raises(UsageError, match="ambiguous"):
        store.get_run("abc")
    assert store.get_run("abc2")["run_id"] == "abc2"


def test_op_stats_aggregates():
    store = RunStore()
    r = store.create_run(model="m", backend="numpy")
    rows = [_row(0, i, "linear", 1000 * i, 1000 * i + d, flops=1000) for i, d in enumerate([100, 200, 300, 400])]
    rows.append(_row(0, 9, "relu", 10_000, 11_000, flops=0, fallback=True))
    store.add_events(r, rows)
    by_op = {s["key"]: s for s in store.op_stats(r)}
    lin = by_op["linear"]
    assert lin["count"] == 4 and lin["total_ns"] == 1000 and lin["self_ns"] == 1000
    assert lin["mean_ns"] == 250 and lin["p50_ns"] == 250 and lin["p95_ns"] == pytest.approx(385)
    assert lin["flops"] == 4000 and lin["achieved_flops"] == pytest.approx(4000 / 1e-6)
    assert lin["share"] == pytest.approx(0.5) and by_op["relu"]["share"] == pytest.approx(0.5)
    assert by_op["relu"]["fallback"] and not lin["fallback"]
    assert [s["key"] for s in store.op_stats(r, by="node")][:1] == ["relu_9"]
    with pytest.raises(UsageError):
        store.op_stats(r, by="colour")


def test_self_time_subtracts_direct_children():
    store = RunStore()
    r = store.create_run(model="m", backend="import", engine="import")
    store.add_events(r, [_row(0, 0, "outer", 0, 1000), _row(0, 1, "inner", 100, 400, depth=1),
                         _row(0, 2, "inner", 500, 600, depth=1), _row(0, 3, "leaf", 120, 220, depth=2),
                         _row(0, 4, "outer", 2000, 2500)])
    s = {x["key"]: x for x in store.op_stats(r)}
    assert s["outer"]["total_ns"] == 1500 and s["outer"]["self_ns"] == 1500 - 400
    assert s["inner"]["self_ns"] == 400 - 100 and s["leaf"]["self_ns"] == 100
    # shares are of self time (issue 27): a nested op's time counts once, where it is spent, and they sum to 1
    assert s["outer"]["share"] == pytest.approx((1500 - 400) / 1500)
    assert s["inner"]["share"] == pytest.approx(300 / 1500) and s["leaf"]["share"] == pytest.approx(100 / 1500)
    assert sum(x["share"] for x in s.values()) == pytest.approx(1.0)


def test_frames_and_artifacts():
    store = RunStore()
    r = store.create_run(model="m", backend="numpy")
    store.add_events(r, [_row(s, i, "add", 100 * (s * 10 + i), 100 * (s * 10 + i) + 50) for s in range(2) for i in range(3)])
    f = store.events_frame(r, columns=["step", "seq", "op", "start_ns"], step=1)
    assert list(f["seq"]) == [0, 1, 2] and set(f["step"]) == {1} and f["op"][0] == "add"
    assert len(store.events_frame(r, t0=0, t1=120)["seq"]) == 2
    store.add_memory(r, [(0, 0, 10, "numpy", 100, 100, 0)])
    store.add_hardware(r, [(10, 50.0, 1 << 20, None, None, None, None)])
    store.add_tensors(r, [(0, 0, "out0", "[2]", "float32", 2, 0.0, 1.0, 0.5, 0.5, 0, 0, "[1,1]", 0.0, 1.0)])
    store.add_stacks(r, [(10, 5, 7, 0, "main (x.py:1)")])
    store.add_artifact(r, "note", "py-spy", b"could not attach")
    assert list(store.memory_frame(r)["live_bytes"]) == [100]
    assert store.hardware_frame(r)["cpu_percent"][0] == 50.0
    assert store.tensors_frame(r)["slot"][0] == "out0"
    assert store.stacks_frame(r)["frame"][0] == "main (x.py:1)"
    assert store.artifacts(r, "note") == [("note", "py-spy", b"could not attach")]


def test_columnar_insert_of_many_events():
    store = RunStore()
    r = store.create_run(model="m", backend="numpy")
    n = 50_000
    cols = {"step": np.zeros(n, np.int64), "seq": np.arange(n), "op": np.array(["a", "b"] * (n // 2), dtype=object)}
    for c in ("node", "module", "source", "backend", "device", "input_shapes", "input_dtypes", "output_shapes",
              "output_dtypes"):
        cols[c] = np.full(n, "x", dtype=object)
    for c in ("thread", "depth", "bytes", "flops", "live_bytes"):
        cols[c] = np.zeros(n, np.int64)
    cols["start_ns"] = np.arange(n) * 10
    cols["end_ns"] = cols["start_ns"] + 5
    cols["fallback"] = np.zeros(n, bool)
    store.add_event_columns(r, cols)
    assert store.get_run(r)["events"] == n
    assert {s["key"]: s["count"] for s in store.op_stats(r)} == {"a": n // 2, "b": n // 2}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_share_the_file(opscope_home):
    """A writer in another process and readers here take turns on DuckDB's file lock."""
    store = RunStore()
    r = store.create_run(model="m", backend="numpy")
    code = (f"from opscope.profiler.store import RunStore\n"
            f"s = RunStore()\n"
            f"for i in range(10):\n"
            f"    s.add_events({r!r}, [(0, i, 'add', 'n', '', '', 'numpy', 'cpu', 1, 0, i, i + 1, '[]', '[]', '[]',"
            f" '[]', 0, 0, False, 0)])\n")
    p = subprocess.Popen([sys.executable, "-c", code])
    seen = 0
    while p.poll() is None:                  # a live view polling the run
        seen = store.get_run(r)["events"]
        time.sleep(0.02)
    assert p.wait() == 0
    assert store.get_run(r)["events"] == 10 >= seen


def test_null_integers_and_numpy_scalars_insert_columnar():
    """Regression: a batch whose integer columns held None fell back to row-by-row executemany (158 s for
    20k events) and crashed on numpy int64 scalars ("Unable to transform numpy.int64")."""
    store = RunStore()
    r = store.create_run(model="m", backend="import", engine="import")
    n = 20_000
    rows = []
    for i in range(n):
        unknown = i % 3 == 0
        rows.append((np.int64(0), np.int64(i), "mm", f"mm_{i}", "", "", "cpu", "cpu", np.int64(7), np.int32(0),
                     np.int64(10 * i), np.int64(10 * i + 5), None, None, None, None,
                     None if unknown else np.int64(64), None if unknown else np.int64(1000), False,
                     None if i % 2 else np.int64(4)))
    store.add_events(r, rows)
    nulls = store.query("SELECT count(*) FILTER (WHERE flops IS NULL), count(*) FILTER (WHERE bytes IS NULL), "
                        "count(*) FILTER (WHERE live_bytes IS NULL), sum(flops), sum(end_ns - start_ns) "
                        "FROM events WHERE run_id = ?", [r])[0]
    known = n - len(range(0, n, 3))
    assert nulls == (len(range(0, n, 3)), len(range(0, n, 3)), n // 2, 1000 * known, 5 * n)
    f = store.events_frame(r, columns=["seq", "thread", "start_ns"])
    assert list(f["seq"][:3]) == [0, 1, 2] and set(f["thread"].tolist()) == {7} and f["start_ns"][-1] == 10 * (n - 1)
    # columns as numpy masked arrays: masked entries are NULLs
    cols = store.events_frame(r)
    cols["flops"] = np.ma.masked_array(np.arange(n, dtype=np.int64), mask=np.arange(n) % 2 == 0)
    store.add_event_columns(r, cols)
    assert store.query("SELECT count(*) FILTER (WHERE flops IS NULL), max(flops) FROM events WHERE run_id = ?",
                       [r])[0] == (len(range(0, n, 3)) + n // 2, n - 1)
    # hardware rows with unknown GPU columns (None among ints and floats) go the same way
    store.add_hardware(r, [(i, 10.0, np.int64(1 << 20), None, None, None, None) for i in range(3)])
    assert store.query("SELECT count(*) FROM hardware WHERE run_id = ? AND gpu_mem_bytes IS NULL AND gpu_util IS NULL",
                       [r]) == [(3,)]


def test_finished_runs_answer_aggregates_from_a_cache_equal_to_the_live_query():
    store = RunStore()
    r = store.create_run(model="m", backend="numpy")
    rows = [_row(s, i, ["linear", "relu", "add"][i % 3], 1000 * (10 * s + i), 1000 * (10 * s + i) + 100 + 37 * i,
                 module=f"layer.{i % 3}", flops=1000 * i) for s in range(3) for i in range(10)]
    store.add_events(r, rows)
    live = {by: store.op_stats(r, by=by) for by in ("op", "module", "node")}      # running: aggregated live
    store.finish_run(r)
    # the cached grouping's name carries the rules version (issue 27: 'op@2'), so older caches are recomputed
    from opscope.profiler.stats import _CACHE_RULES
    assert store.query("SELECT grouping, count(*) FROM op_stats_cache WHERE run_id = ? GROUP BY ALL",
                       [r]) == [("op" + _CACHE_RULES, 3)]
    store.query("INSERT INTO op_stats_cache (run_id, grouping, events, rank, key) VALUES (?, 'op', 30, 1, 'x')", [r])
    assert store.op_stats(r) == live["op"]                                          # a pre-version cache is not read
    for by in ("op", "module", "node"):
        assert store.op_stats(r, by=by) == live[by]                                # cached (or cached now)
        assert store.op_stats(r, by=by) == live[by]
    store.add_events(r, [_row(3, 0, "relu", 50_000, 60_000)])                     # more events: the cache is stale
    assert {s["key"]: s["count"] for s in store.op_stats(r)}["relu"] == 3 * 3 + 1
    store.delete_run(r)
    assert store.query("SELECT count(*) FROM op_stats_cache WHERE run_id = ?", [r]) == [(0,)]


@pytest.mark.multiprocess
def test_a_run_whose_collector_was_killed_is_marked_failed_not_running_forever(tmp_path):
    """Regression: `opscope profile --web` killed with SIGKILL left its run 'running' for ever."""
    import subprocess
    import sys
    path = tmp_path / "runs.duckdb"
    code = ("import os; from opscope.profiler.store import RunStore; s = RunStore(%r); "
            "rid = s.create_run(model='m', backend='numpy'); "
            "s.add_events(rid, [(0, 0, 'relu', 'relu', '', '', 'numpy', 'cpu', 1, 0, 1, 2, '[]', '[]', '[]', '[]', 0, 0, "
            "False, 0)]); "
            "print(rid, flush=True); os._exit(0)") % str(path)
    rid = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    store = RunStore(path)
    live = store.create_run(model="m2", backend="numpy")          # this process is alive: untouched
    runs = {r["run_id"]: r for r in store.list_runs()}
    assert runs[rid]["status"] == "failed" and "ended without closing it" in runs[rid]["error"]
    assert runs[live]["status"] == "running"
    assert store.get_run(rid)["status"] == "failed"
    assert len(store.events_frame(rid)["op"]) == 1                 # the events that arrived are kept
