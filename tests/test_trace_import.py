"""Trace import: torch.profiler (Kineto) traces, ONNX Runtime profiles, and files that are neither."""
import json
import os
from collections import Counter

import pytest
import torch

from opscope.profiler.importers import import_trace
from opscope.profiler.importers.names import op_for_aten_name
from opscope.profiler.store import RunStore


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))), dim=-1)


def torch_profiler_trace(path, steps=1, schedule=False):
    """Profile TinyNet with torch.profiler, export its Chrome trace; -> key_averages() counts by name."""
    torch.manual_seed(0)
    model, x = TinyNet(), torch.randn(8, 16)
    # a schedule records `steps` active steps after one warm-up step, each marked ProfilerStep#N
    kw = {"schedule": torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)} if schedule else {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, **kw) as prof:
        for _ in range(steps + 1 if schedule else steps):
            model(x)
            if schedule:
                prof.step()
    prof.export_chrome_trace(str(path))
    return {k.key: k.count for k in prof.key_averages()}


def cpu_op_names(path):
    return {e["name"] for e in json.load(open(path))["traceEvents"] if e.get("cat") == "cpu_op"}


def test_torch_profiler_trace_imports_into_the_same_per_op_table_as_key_averages(tmp_path, cli):
    trace = tmp_path / "torch_trace.json"
    averages = torch_profiler_trace(trace, steps=2)
    r = cli("trace", "import", trace, "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    store = RunStore()
    run = store.get_run(rid)
    assert run["engine"] == "import" and run["source"] == str(trace.resolve()) and run["status"] == "ok"
    # what a torch.profiler trace does not know is NULL in the store, not 0
    n, live, flops = store.query("SELECT count(*), count(live_bytes), count(flops) FROM events WHERE run_id = ?",
                                 [rid])[0]
    assert n > 0 and live == 0 and flops == 0

    names = cpu_op_names(trace)
    want = {k: c for k, c in averages.items() if k in names}
    assert "aten::linear" in want and want["aten::linear"] == 4
    # by node: the ATen names, exactly as torch.profiler counts them
    assert {r["key"]: r["count"] for r in store.op_stats(rid, by="node")} == want
    # by op: opscope names (aten::linear -> linear), ATen names kept where opscope has no op
    by_op = Counter()
    for k, c in want.items():
        by_op[op_for_aten_name(k)] += c
    got = {r["key"]: r["count"] for r in store.op_stats(rid)}
    assert got == dict(by_op) and got["linear"] == 4 and got["layer_norm"] == 2

    # nesting gives depth, so self time is below total time for ops that call others
    lin = next(r for r in store.op_stats(rid, by="node") if r["key"] == "aten::linear")
    assert 0 <= lin["self_ns"] < lin["total_ns"]
    ev = store.events_frame(rid, columns=["node", "depth", "input_shapes", "input_dtypes"])
    i = ev["node"].tolist().index("aten::linear")
    assert ev["depth"][i] == 0 and json.loads(ev["input_shapes"][i])[0] == [8, 16]
    assert json.loads(ev["input_dtypes"][i])[0] == "float32"
    assert max(ev["depth"].tolist()) >= 2                   # linear > addmm-like children > ...


def test_torch_profiler_schedule_steps_become_steps(tmp_path):
    trace = tmp_path / "sched.json"
    averages = torch_profiler_trace(trace, steps=3, schedule=True)
    rid = import_trace(trace)
    store = RunStore()
    ev = store.events_frame(rid, columns=["step", "node"])
    assert sorted(set(ev["step"].tolist())) == [0, 1, 2]
    per_step = Counter(s for s, n in zip(ev["step"].tolist(), ev["node"].tolist()) if n == "aten::linear")
    assert per_step == {0: 2, 1: 2, 2: 2}
    names = cpu_op_names(trace) - {n for n in averages if n.startswith("ProfilerStep#")}
    assert Counter(ev["node"].tolist()) == {k: c for k, c in averages.items() if k in names}


ORT_PROFILE = [
    {"cat": "Session", "pid": 4242, "tid": 4242, "dur": 900, "ts": 3, "ph": "X", "name": "model_loading_uri",
     "args": {}},
    {"cat": "Session", "pid": 4242, "tid": 4242, "dur": 1500, "ts": 910, "ph": "X", "name": "session_initialization",
     "args": {}},
]


def _ort_node(ts, name, op, dur, provider="CPUExecutionProvider"):
    args = {"op_name": op}
    kernel = {"thread_scheduling_stats": "", "output_size": "512", "parameter_size": "2176", "activation_size": "256",
              "node_index": "0", "input_type_shape": [{"float": [8, 16]}, {"float": [32, 16]}, {"float": [32]}],
              "output_type_shape": [{"float": [8, 32]}], "exec_plan_index": "0", "op_name": op, "provider": provider}
    return [{"cat": "Node", "pid": 4242, "tid": 4250, "dur": 0, "ts": ts, "ph": "X", "name": f"{name}_fence_before",
             "args": args},
            {"cat": "Node", "pid": 4242, "tid": 4250, "dur": dur, "ts": ts + 1, "ph": "X", "name": f"{name}_kernel_time",
             "args": kernel},
            {"cat": "Node", "pid": 4242, "tid": 4250, "dur": 0, "ts": ts + dur + 1, "ph": "X",
             "name": f"{name}_fence_after", "args": args}]


def ort_profile(runs=2):
    events = list(ORT_PROFILE)
    t = 3000
    for _ in range(runs):
        start = t
        for name, op, dur in [("/fc1/Gemm", "Gemm", 40), ("/act/Gelu", "Gelu", 12), ("/fc2/Gemm", "Gemm", 20),
                              ("/fused/FusedMatMul", "FusedMatMul", 9)]:
            events += _ort_node(t, name, op, dur)
            t += dur + 5
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start, "ts": start, "ph": "X",
                       "name": "SequentialExecutor::Execute", "args": {}})
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start + 2, "ts": start - 1, "ph": "X",
                       "name": "model_run", "args": {}})
        t += 100
    return events


def test_onnxruntime_profile_imports_kernel_times_per_step(tmp_path, cli):
    path = tmp_path / "onnxruntime_profile__2024.json"
    path.write_text(json.dumps(ort_profile(runs=2)))
    r = cli("trace", "import", path)
    assert r.returncode == 0, r.stderr
    rid = r.stdout.strip()
    store = RunStore()
    assert store.get_run(rid)["backend"] == "CPUExecutionProvider"
    got = {r["key"]: (r["count"], r["total_ns"]) for r in store.op_stats(rid)}
    assert got == {"linear": (4, 120_000), "gelu": (2, 24_000), "FusedMatMul": (2, 18_000)}
    ev = store.events_frame(rid, columns=["step", "node", "thread", "output_shapes"])
    assert Counter(ev["step"].tolist()) == {0: 4, 1: 4}
    assert set(ev["thread"].tolist()) == {4250} and "/fc1/Gemm" in ev["node"].tolist()
    assert json.loads(ev["output_shapes"][0]) == [[8, 32]]


# --- files that are not traces: exit 2, one line, the store untouched ------------------------------
def opscope_main(capsys, *args):
    """The CLI's own main, in this process (a subprocess per bad file costs seconds of imports)."""
    from opscope.app.cli import main
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _store_snapshot(store):
    return [(r["run_id"], r["events"], r["status"]) for r in store.list_runs()], \
        store.query("SELECT count(*) FROM events")[0][0]


@pytest.mark.parametrize("name,content", [
    ("garbage.json", os.urandom(4096)),
    ("truncated.json", None),                  # a real torch.profiler trace, cut in half
    ("empty.json", b""),
    ("object.json", b'{"hello": "world"}'),
    ("numbers.json", b"[1, 2, 3]"),
    ("bad_ts.json", json.dumps({"traceEvents": [{"ph": "X", "name": "aten::add", "ts": "soon", "dur": 1,
                                                  "pid": 1, "tid": 1}]}).encode()),
    ("no_ops.json", json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]}).encode()),
    ("bad.json.gz", b"\x1f\x8b\x08\x00garbage"),
])
def test_bad_trace_files_exit_2_with_one_line_and_leave_the_store_alone(tmp_path, capsys, name, content):
    good = tmp_path / "good.json"
    torch_profiler_trace(good)
    store = RunStore()
    first = import_trace(good, store=store)
    before = _store_snapshot(store)
    bad = tmp_path / name
    if content is None:
        data = good.read_bytes()
        content = data[: len(data) // 2]
    bad.write_bytes(content)
    code, out, err = opscope_main(capsys, "trace", "import", bad)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:") and str(bad) in lines[0], err
    assert out == ""
    assert _store_snapshot(store) == before
    assert store.get_run(first)["events"] == before[0][0][1]


def test_files_over_the_size_limit_are_refused_before_reading(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "big.json"
    torch_profiler_trace(trace)
    size = trace.stat().st_size
    code, _, err = opscope_main(capsys, "trace", "import", trace, "--max-bytes", size - 1)
    assert code == 2 and "over the import limit" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("OPSCOPE_IMPORT_MAX_BYTES", str(size // 2))
    code, _, err = opscope_main(capsys, "trace", "import", trace)
    assert code == 2 and "OPSCOPE_IMPORT_MAX_BYTES" in err
    assert RunStore().list_runs() == []
    code, out, err = opscope_main(capsys, "trace", "import", trace, "--max-bytes", size)
    assert code == 0 and RunStore().get_run(out.strip())["events"] > 0, err


class DiskFullStore(RunStore):
    """A store whose event write fails halfway: the import must not leave a run behind."""

    def add_event_columns(self, run_id, cols, **kw):
        half = {k: v[: len(v) // 2] for k, v in cols.items()}
        super().add_event_columns(run_id, half, **kw)
        raise OSError("No space left on device")


def test_a_failed_write_removes_the_partial_run(tmp_path):
    trace = tmp_path / "t.json"
    torch_profiler_trace(trace)
    store = DiskFullStore()
    with pytest.raises(OSError):
        import_trace(trace, store=store)
    assert store.list_runs() == [] and store.query("SELECT count(*) FROM events")[0][0] == 0
