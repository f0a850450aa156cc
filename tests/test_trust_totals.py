"""Issue 27's audit, on a real torch.profiler training trace recorded here (4 AdamW steps, nested aten ops,
record_function): no grouping's total exceeds the step, in every grouping, step by step; a group's total is its
time counted once (the union of its spans per thread), so an `aten::matmul` holding its `aten::mm` counts 75 ms
once, not twice; a trace whose every timestamp passes int64 nanoseconds (x_t0 = 9.222e18 us) is refused."""
import json

import pytest

from opscope.profiler import stats
from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore

from torch_traces import record_training

GROUPINGS = ("name", "op", "node", "module", "category")


@pytest.fixture(scope="module")
def training_trace(tmp_path_factory):
    return record_training(tmp_path_factory.mktemp("trace") / "train.json")


def _union_per_thread(rows) -> int:
    """A group's time counted once: the union of its spans on each thread, summed over threads."""
    threads = {t for t, _, _ in rows}
    return sum(stats.union_ns([s for t, s, _ in rows if t == th], [e for t, _, e in rows if t == th])
               for th in threads)


def test_no_grouping_total_exceeds_the_step_in_any_step(training_trace):
    store = RunStore()
    rid = import_trace(training_trace, store)
    with store.connect(read_only=True) as con:
        t = stats.run_times(con, rid)
        assert len(t["steps"]) == 4
        for step in t["steps"]:
            for by in GROUPINGS:
                rows = stats.op_stats(con, rid, by, step=step["step"])
                assert rows, (by, step["step"])
                # a group runs inside the step: its inclusive time (children once) cannot pass the step's host time
                worst = max(rows, key=lambda r: r["total_ns"])
                assert worst["total_ns"] <= step["host_ns"], (by, step["step"], worst["key"])


def test_a_groups_total_is_its_time_counted_once(training_trace):
    """total_ns == the union of the group's spans: a nested op of the same group (aten::linear > aten::addmm, both
    'linear' by op type) adds nothing; counting it again would pass the union by the inner op's time."""
    store = RunStore()
    rid = import_trace(training_trace, store)
    nested_groups = 0
    with store.connect(read_only=True) as con:
        t = stats.run_times(con, rid)
        for by in ("name", "op", "node", "category"):       # module rolls up children: checked against the step above
            key = stats.key_sql(con, rid, by)
            for r in stats.op_breakdown(con, rid, by, times=t):
                if r["kind"] != "host":
                    continue
                spans = con.execute(f"SELECT thread, start_ns, end_ns, depth FROM events WHERE run_id = ? AND "
                                    f"{key} IS NOT DISTINCT FROM ? AND {stats.kind_sql()} = 'host'",
                                    [rid, r["key"]]).fetchall()
                once = _union_per_thread([(th, s, e) for th, s, e, _ in spans])
                assert r["total_ns"] == once, (by, r["key"], r["total_ns"], once)
                nested_groups += once < sum(e - s for _, s, e, _ in spans)
    assert nested_groups >= 2      # the trace does nest ops of one group (else this test could not fail)


def test_a_trace_whose_every_time_passes_int64_ns_is_refused_naming_the_event(tmp_path, cli):
    from test_gpu_kernels import hta_trace
    doc = hta_trace()
    t0 = min(e["ts"] for e in doc["traceEvents"])
    for e in doc["traceEvents"]:           # the whole trace shifted to x_t0 = 9.222e18 us: its span is short
        e["ts"] = 9.222e18 + (e["ts"] - t0)
    path = tmp_path / "far.json"
    path.write_text(json.dumps(doc))
    r = cli("trace", "import", path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "9.222e+18" in r.stderr and "ProfilerStep#0" in r.stderr and "Traceback" not in r.stderr
    assert RunStore().list_runs() == []
