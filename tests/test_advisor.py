"""The advisor on real runs: which op to implement next, reduced precision estimated and then
measured with --apply, and advice that does not pay off marked so."""
import json

import pytest

from opscope.profiler import RunStore, profile
from opscope.profiler.advisor import advise, analyze, load
from opscope.runtime import models, open_session

CHIP = """
[backend]
name = "{name}"
implementation = "sim"
fallback = "numpy"
[hardware]
kind = "npu"
peak_flops = {{ float32 = 1.0e13, float16 = 4.0e13 }}
memory_bandwidth = 1.0e12
memory_capacity = 1.6e10
launch_overhead = 1.0e-7
host_bandwidth = 1.0e10
[operators]
unsupported = {unsupported}
"""


def _chip(tmp_path, name="half-chip", unsupported=()):
    path = tmp_path / f"{name}.toml"
    path.write_text(CHIP.format(name=name, unsupported=json.dumps(list(unsupported))))
    return str(path)


def _profile(model_spec, backend_spec):
    model, inputs = models.load(model_spec)
    return profile(model_spec, backend_spec, model=model, inputs=inputs)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_unsupported_hot_op_is_the_first_thing_to_implement(tmp_path):
    chip = _chip(tmp_path, "no-gelu", ["gelu"])
    run_id = _profile("demo:gpt", chip)
    advice = advise(run_id)
    first = advice[0]
    assert first.rule == "implement-fallback-op" and first.id == "implement-fallback-op:gelu"
    ev = first.evidence
    assert ev["op"] == "gelu" and ev["calls"] == 4 and ev["seconds"] > 0
    assert sorted(ev["nodes"]) == ["gelu", "gelu_1", "gelu_2", "gelu_3"]
    # the bytes it moves are the transfers placement inserted for it, in and out, every one of them
    placed = open_session("demo:gpt", chip).plan.placement.report()
    assert ev["transfer_bytes"] == placed["transfer_bytes"] > 0
    assert first.estimated_gain["seconds"] > 0 and "gelu" in first.message


@pytest.mark.multiprocess
@pytest.mark.slow
def test_reduced_precision_is_estimated_then_measured_with_its_error(tmp_path, cli):
    chip = _chip(tmp_path)
    run_id = _profile("demo:mlp", chip)
    advice = {a.rule: a for a in advise(run_id)}
    rp = advice["reduced-precision"]
    assert rp.apply == {"kind": "dtype", "dtype": "float16"}
    assert 0.3 < rp.estimated_gain["fraction"] < 0.75     # at most 4x: the 4x peak, minus launch overhead

    r = cli("advise", run_id, "--apply", "reduced-precision", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    new = RunStore().get_run(doc["run_id"])
    assert new["parent_run"] == run_id and new["run_id"] != run_id
    assert new["config"]["advice"] == "reduced-precision"
    # the sim clock is the roofline the estimate came from: measured and estimated agree
    assert doc["measured"]["fraction"] == pytest.approx(rp.estimated_gain["fraction"], rel=0.05)
    assert doc["paid_off"] is True
    # float16 changes the numbers, a little
    assert 0 < doc["error"]["max_abs"] < 0.05 and doc["error"]["cosine"] > 0.999
    dtypes = {e["dtype"] for e in load(doc["run_id"]).events}
    assert dtypes == {"float16"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_advice_that_does_not_pay_off_is_marked(tmp_path, cli):
    chip = _chip(tmp_path, "plain-chip")
    run_id = _profile("demo:mlp", chip)
    rules = tmp_path / "noop.toml"
    rules.write_text('''
[[rule]]
id = "stay-float32"
title = "Cast to float32"
condition = "true"
gain = "time.seconds * 0.5"
message = "an optimistic rule that changes nothing"
apply = { kind = "dtype", dtype = "float32" }
''')
    r = cli("advise", run_id, "--rules", rules, "--apply", "stay-float32", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["paid_off"] is False and "did not pay off" in doc["verdict"]
    assert doc["estimated"]["fraction"] == pytest.approx(0.5)
    assert doc["error"]["max_abs"] == 0


def test_analyses_of_a_numpy_run_without_a_roofline():
    run_id = _profile("demo:mlp", "numpy")
    a = analyze(load(run_id))
    assert a["hw"]["roofline"] is False and a["dtype"]["fast"] == ""
    assert a["fallback"]["count"] == 0 and a["transfers"]["bytes"] == 0
    assert a["dominant"]["top_op"] in ("linear", "relu")
    assert a["fusion"]["chains"] == 0       # linear, relu, linear, relu: no two elementwise ops in a row
    assert all(x.rule not in ("reduced-precision", "implement-fallback-op") for x in advise(run_id))


def test_apply_refuses_advice_it_cannot_apply(tmp_path):
    from opscope.profiler.advisor.apply import apply_advice
    from opscope.runtime.errors import UsageError
    run_id = _profile("demo:mlp", _chip(tmp_path))
    with pytest.raises(UsageError, match="no advice 'nonsense'"):
        apply_advice(run_id, "nonsense")
    with pytest.raises(UsageError, match="cannot be applied automatically"):
        apply_advice(run_id, "dominant-op")


def _imported(tmp_path, doc):
    from opscope.profiler.importers import import_trace
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return import_trace(path)


def test_an_imported_gpu_trace_whose_gpu_waits_is_told_to_launch_fewer_kernels(tmp_path):
    """torch.profiler with CUDA: kernels are what the GPU did; the rest of each step it waited for the host."""
    from test_trace_import import GPU_ROWS, kineto_gpu_trace
    run_id = _imported(tmp_path, kineto_gpu_trace())
    a = analyze(load(run_id))
    steps = a["run"]["steps"]
    busy_us = 0.0                                         # the kernels' union per step, from the fixture itself
    for step in {r[3] for r in GPU_ROWS}:
        end = None
        for ts, dur in sorted((r[4], r[5]) for r in GPU_ROWS if r[3] == step):
            lo = ts if end is None else max(ts, end)
            busy_us += max(ts + dur - lo, 0.0)
            end = ts + dur if end is None else max(end, ts + dur)
    dev = a["device"]
    assert dev["kernels"] == len(GPU_ROWS) // steps and dev["name"] == "cuda:0"
    assert dev["busy_seconds"] == pytest.approx(busy_us / 1e6 / steps, rel=1e-9)
    assert dev["idle_seconds"] == pytest.approx(dev["step_seconds"] - dev["busy_seconds"])
    first = advise(run_id)[0]
    assert first.rule == "device-idle" and "CUDA graph" in first.message
    assert first.estimated_gain["seconds"] == pytest.approx(dev["idle_seconds"] / 2)
    # the step's busy time counts top-level host ops once (aten::linear, not also the addmm inside it)
    events = load(run_id).events
    top = sum(e["seconds"] for e in events if not e["on_device"] and e["depth"] == 0) / steps
    assert a["time"]["seconds"] == pytest.approx(top)
    assert all(x.rule != "cpu-tune" for x in advise(run_id))     # nothing here to tune: an imported trace


def test_a_cpu_only_trace_has_no_device_advice(tmp_path):
    from test_trace_import import kineto_gpu_trace
    doc = kineto_gpu_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    run_id = _imported(tmp_path, doc)
    assert analyze(load(run_id))["device"]["kernels"] == 0
    assert all(x.rule != "device-idle" for x in advise(run_id))
