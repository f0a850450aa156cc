"""Profiling: event fields, warm-up, values, the eager engine, failures, the runner process, the CLI."""
import json
import os
import signal
import textwrap
import time

import pytest

from opscope.profiler import RunFailed, RunStore, profile, start_profile
from opscope.runtime import models
from opscope.runtime.backends import resolve
from opscope.runtime.errors import UsageError
from opscope.runtime.roofline import node_seconds

RAISES = """
import torch

class Flaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = torch.relu(self.lin(x))
        if self.calls == 2:
            raise RuntimeError("boom on the second call")
        return y * 2

def factory():
    return Flaky(), (torch.randn(4, 8),)
"""


def _in_process(spec, backend, **kw):
    model, inputs = models.load(spec)
    return profile(spec, backend, model=model, inputs=inputs, **kw)


def test_graph_events_carry_the_nodes_fields():
    from opscope.runtime import open_session
    store = RunStore()
    run = _in_process("demo:mlp", "numpy", steps=2, warmup=1, store=store)
    s = open_session("demo:mlp", "numpy")
    n = len(s.plan.steps)
    assert store.get_run(run)["events"] == 2 * n and store.get_run(run)["status"] == "ok"
    ev = store.events_frame(run)
    assert sorted(set(ev["step"].tolist())) == [0, 1]                  # the warm-up step is not recorded
    first = {k: v[0] for k, v in ev.items()}
    node = s.plan.steps[0].node
    assert first["op"] == node.op and first["node"] == node.name and first["module"] == node.module_path
    assert first["flops"] == node.flops and first["bytes"] == node.bytes_moved
    assert json.loads(first["input_shapes"])[0] == list(node.input_meta[0].shape)
    assert first["backend"] == "numpy" and first["thread"] > 0 and first["end_ns"] >= first["start_ns"]
    assert list(ev["seq"][:n]) == list(range(n))
    mem = store.memory_frame(run)
    assert len(mem["live_bytes"]) > 0 and mem["live_bytes"].max() > 0


def test_sim_backend_times_are_the_roofline():
    from opscope.runtime import open_session
    store = RunStore()
    run = _in_process("demo:mlp", "sim:npu-a1", store=store)
    s = open_session("demo:mlp", "sim:npu-a1")
    ev = store.events_frame(run)
    want = [int(node_seconds(st.node, resolve("sim:npu-a1").description) * 1e9) for st in s.plan.steps]
    assert list(ev["end_ns"] - ev["start_ns"]) == want


def test_values_summarize_every_output():
    store = RunStore()
    run = _in_process("demo:mlp", "numpy", values=True, store=store)
    t = store.tensors_frame(run)
    ev = store.events_frame(run)
    assert len(t["slot"]) == len(ev["seq"]) and set(t["slot"]) == {"out0"}
    i = 0
    assert t["count"][i] == json.loads(ev["output_shapes"][0])[0][0] * json.loads(ev["output_shapes"][0])[0][1]
    assert t["min"][i] <= t["mean"][i] <= t["max"][i] and len(json.loads(t["hist"][i])) == 16
    assert sum(json.loads(t["hist"][i])) == t["count"][i] - t["nan"][i] - t["inf"][i]


def test_eager_engine_times_every_aten_op_with_modules():
    store = RunStore()
    run = _in_process("demo:mlp", "torch:cpu", engine="eager", steps=2, store=store)
    stats = {s["key"]: s for s in store.op_stats(run)}
    assert stats and all(s["count"] % 2 == 0 for s in stats.values())  # the same ops in both steps
    assert any(s["flops"] > 0 for s in stats.values())                  # matmuls have a cost model
    mods = {s["key"] for s in store.op_stats(run, by="module")}
    assert any(m not in ("", "(top)") for m in mods)
    assert store.get_run(run)["engine"] == "eager"


def test_eager_needs_a_torch_backend():
    with pytest.raises(UsageError, match="torch backend"):
        start_profile("demo:mlp", "numpy", engine="eager")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_runner_process_profile_with_hardware_samples():
    store = RunStore()
    run = profile("demo:mlp", "numpy", steps=3, warmup=2, store=store)
    r = store.get_run(run)
    assert r["status"] == "ok" and r["events"] == 3 * 5 and r["dropped"] == 0 and r["warmup"] == 2
    assert r["config"]["placement"]["nodes_per_backend"]
    assert len(store.hardware_frame(run)["t_ns"]) > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_model_that_raises_leaves_a_failed_run_with_earlier_events(tmp_path):
    f = tmp_path / "flaky.py"
    f.write_text(RAISES)
    store = RunStore()
    with pytest.raises(RunFailed, match="boom on the second call") as e:
        profile(f"{f}:factory", "torch:cpu", engine="eager", steps=3, store=store)
    r = store.get_run(e.value.run_id)
    assert r["status"] == "failed" and "boom on the second call" in r["error"]
    ev = store.events_frame(r["run_id"])
    assert set(ev["step"].tolist()) >= {0} and r["events"] == len(ev["seq"]) > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_killing_the_runner_keeps_the_events_up_to_the_kill():
    store = RunStore()
    live = start_profile("demo:mlp", "numpy", steps=1_000_000, store=store, hardware=False)
    deadline = time.monotonic() + 240
    while store.get_run(live.run_id)["events"] < 50:
        assert live.poll() == "running" and time.monotonic() < deadline, live.error
        time.sleep(0.1)
    os.kill(live.pid, signal.SIGKILL)
    assert live.wait(120) == "failed"
    r = store.get_run(live.run_id)
    assert r["status"] == "failed" and "SIGKILL" in r["error"]
    assert 50 <= r["events"] < 5_000_000 and r["events"] == len(store.events_frame(live.run_id)["seq"])
    assert store.query("SELECT count(*) FROM events WHERE run_id = ? AND op IS NULL", [live.run_id])[0][0] == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_py_spy_samples_or_says_why_not():
    store = RunStore()
    run = profile("demo:mlp", "numpy", steps=200, store=store, py_spy=True)
    kinds = {k for k, _, _ in store.artifacts(run)}
    if "speedscope" in kinds:
        doc = json.loads(store.artifacts(run, "speedscope")[0][2])
        assert doc["profiles"] and len(store.stacks_frame(run)["frame"]) > 0
    else:
        note = store.artifacts(run, "note")[0][2].decode()
        assert "py-spy" in note and store.get_run(run)["config"]["py_spy"] == note


# --- the command line ------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_profile_runs_show_compare(cli):
    a = cli("profile", "demo:mlp", "--backend", "numpy", "--steps", "2", "--json")
    assert a.returncode == 0, a.stderr
    doc_a = json.loads(a.stdout)
    assert doc_a["status"] == "ok" and doc_a["events"] == 10 and doc_a["top_ops"][0]["key"]
    b = cli("profile", "demo:mlp", "-b", "sim:npu-a1", "--json")
    doc_b = json.loads(b.stdout)
    runs = json.loads(cli("runs", "--json").stdout)["runs"]
    assert [r["run_id"] for r in runs] == [doc_b["run_id"], doc_a["run_id"]]
    show = json.loads(cli("show", doc_a["run_id"][:5], "--json", "--by", "module").stdout)
    assert show["run"]["run_id"] == doc_a["run_id"] and show["by"] == "module" and show["ops"]
    cmp = cli("compare", doc_a["run_id"], doc_b["run_id"], "--json")
    assert cmp.returncode == 0, cmp.stderr
    c = json.loads(cmp.stdout)
    assert c["matched"] == 5 and not c["only_a"] and not c["only_b"]
    assert all(n["ratio"] > 0 for n in c["nodes"])
    text = cli("show", doc_a["run_id"])
    assert text.returncode == 0 and doc_a["run_id"] in text.stdout and "per op" in text.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_bad_input_exits_2(cli):
    for args, msg in [(("show", "nope"), "unknown run 'nope'"), (("compare", "x", "y"), "unknown run"),
                      (("profile", "demo:mlp", "-b", "warp-drive"), "unknown backend"),
                      (("profile", "demo:nothing"), "unknown model spec"),
                      (("profile", "demo:mlp", "-b", "numpy", "--engine", "eager"), "torch backend")]:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert msg in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_failed_model_exits_1_with_the_run(cli, tmp_path):
    f = tmp_path / "flaky.py"
    f.write_text(textwrap.dedent(RAISES))
    r = cli("profile", f"{f}:factory", "--engine", "eager", "--steps", "3", "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed" and "boom" in doc["error"] and doc["run_id"]
