"""openvino[:DEVICE]: regions converted and compiled by OpenVINO, float32 kept float32 (the precision hint read
back from the compiled model), float64 refused to the fallback, a refused gelu splits a block in two, and a
device the machine lacks exits 2 in one line."""
import json

import pytest
import torch

pytest.importorskip("openvino")

from opscope.runtime.demos.gpt import GPT  # noqa: E402
from opscope.runtime.regions import RegionProfile  # noqa: E402
from opscope.runtime.session import compare, open_session  # noqa: E402


def one_block():                 # as tests/test_regions.py
    torch.manual_seed(0)
    return GPT(layers=1).eval(), (torch.randint(0, 2048, (2, 16)),)


def chip(tmp_path, options="", operators=""):
    p = tmp_path / "ov.toml"
    p.write_text('[backend]\nname = "ov"\nimplementation = "openvino"\nfallback = "torch:cpu"\n'
                 f'[backend.options]\ndevice = "CPU"\n{options}\n[operators]\n{operators}\n')
    return str(p)


def regions(s):
    return [st for st in s.plan.steps if st.node.op == "region"]


def test_a_block_is_one_region_computed_in_float32_with_per_op_spans(tmp_path):
    model, inputs = one_block()
    s = open_session("block", "openvino", model=model, inputs=inputs)
    (st,) = regions(s)
    # NOTE: this CPU has bf16 units; without the hint OpenVINO would pick bf16 (error ~5e-3)
    assert str(st.kernel.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4
    prof = RegionProfile()
    with s.executor.hooked(prof):
        s.run()
    children = prof.children[(s.executor.step - 1, "region0")]
    assert children and {c.region for c in children} == {"region0"}
    fused = next(c for c in children if "gelu" in c.ops)    # OpenVINO runs gelu inside the linear before it
    assert fused.ops == ["linear", "gelu"] and fused.flops > 0
    assert len({n for c in children for n in c.nodes}) >= 0.7 * len(st.node.attrs["members"])


def test_the_description_says_the_precision(tmp_path):
    model, inputs = one_block()
    s = open_session("block", chip(tmp_path, 'precision = "bf16"'), model=model, inputs=inputs)
    (st,) = regions(s)
    import openvino as ov
    # OpenVINO takes the hint where the CPU computes in bf16 (AMX, AVX512-BF16) and keeps f32 on a CPU without it
    has_bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    want = "<Type: 'bfloat16'>" if has_bf16 else "<Type: 'float32'>"
    assert str(st.kernel.compiled.get_property("INFERENCE_PRECISION_HINT")) == want


def test_float64_is_refused_to_the_fallback_not_rounded():
    model, inputs = one_block()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).double()
    s = open_session("f64", "openvino", model=model, inputs=(torch.randn(4, 8, dtype=torch.float64),))
    rep = s.plan.placement.report()
    assert not regions(s) and {r["op"] for r in rep["left_out"]} == {"linear", "gelu"}
    assert all("float64" in r["reason"] for r in rep["left_out"])
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-12      # float64 all the way, on torch:cpu


def test_a_description_refusing_gelu_gives_two_regions_and_gelu_on_the_fallback(tmp_path):
    model, inputs = one_block()
    s = open_session("block", chip(tmp_path, operators='unsupported = ["gelu"]'), model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert [g["name"] for g in rep["regions"]] == ["region0", "region1"]
    assert [f["op"] for f in rep["fallback_ops"]] == ["gelu"]
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec, lacking", [("openvino:NPU", "NPU"), ("openvino:AUTO:NPU,CPU", "NPU"),
                                           ("openvino:HETERO:GPU.1,CPU", "GPU.1")])
def test_a_device_the_machine_lacks_is_one_line_exit_2(cli, spec, lacking):
    # AUTO/HETERO lists too: OpenVINO itself would fail at compile, exit 1 with a C++ frame for a reason
    r = cli("run", "demo:mlp", "-b", spec)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert spec in r.stderr and f"device {lacking} is not on this machine" in r.stderr


@pytest.mark.multiprocess
def test_demo_gpt_on_openvino_matches_eager_with_a_region_in_the_report(cli):
    r = cli("run", "demo:gpt", "-b", "openvino", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] < 1e-4
    assert [(g["name"], g["nodes"]) for g in doc["placement"]["regions"]] == [("region0", 82)]
