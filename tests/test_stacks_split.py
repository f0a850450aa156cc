"""A region a stack claimed and then failed to compile is split, not the end of the run (runtime/partition.py):
OpenVINO's importer has no rule for aten::lgamma (it names the op: that member goes to the fallback) and
its converter fails cumprod with a message that names nothing (bisection finds it; the LSTM that served here
before compiles since regions are converted at static shapes: tests/test_stacks_models.py pins it as one
region). (The ONNX exporter's `aten::full_like` in Llama's training graph, split here before, is now exported as its torch form: the training
matrix in test_stacks_train.py pins that cell.) Each model then matches eager, the report and --json
say what was split and why, and a plan remembers the split so loading it compiles nothing that fails. And ONNX
Runtime's claim asks the exporter's registry under the names it knows (in-place and dunder ops): an in-place UNet
is one region."""
import json
import sys
from pathlib import Path

import pytest
import torch

from opscope.runtime.session import compare, open_session

MODELS = Path(__file__).parent / "models"
sys.path.insert(0, str(Path(__file__).parent))


class Scan(torch.nn.Module):
    """A log-gamma between two linears (a Poisson or Dirichlet head's log-likelihood): OpenVINO's importer has no
    rule for aten::lgamma, and says so by name. (Not logcumsumexp: under torch.compile AOTAutograd decomposes it
    into ops OpenVINO converts.)"""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.lgamma(self.a(x).relu() + 1.0)).softmax(-1)


def scan():
    torch.manual_seed(0)
    return Scan().eval(), (torch.randn(2, 5, 8),)


def splits_of(report, op):
    return [sp for sp in report["splits"] if op in sp["ops"]]


# NOTE: multiprocess: OpenVINO's converter starts processes of its own
@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_op_openvino_cannot_convert_goes_to_the_fallback_with_openvinos_reason_and_matches_eager():
    pytest.importorskip("openvino")
    model, inputs = scan()
    s = open_session("scan", "openvino", model=model, inputs=inputs)
    rep = s.plan.placement.report()
    (sp,) = splits_of(rep, "lgamma")                 # named by the stack, found at once
    assert sp["found_by"] == "named by the stack" and sp["compiles"] == 1
    assert "No conversion rule found for operations: aten::lgamma" in sp["reason"]
    why = {o["node"]: o["reason"] for o in rep["left_out"]}
    assert all("openvino failed it inside a region" in why[n] for n in sp["nodes"])
    fell = {f["op"]: f for f in rep["fallback_ops"]}
    assert fell["lgamma"]["backend"] == "torch:cpu" and "aten::lgamma" in fell["lgamma"]["reason"]
    assert [g["nodes"] for g in rep["regions"]] == [3, 2]          # linear, relu, +1; then linear + softmax
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_op_openvino_fails_namelessly_is_split_by_bisection_in_run_json_and_a_plan_remembers_it(cli, tmp_path):
    pytest.importorskip("openvino")
    spec = f"{MODELS / 'stick_breaking.py'}:factory"
    r = cli("run", spec, "-b", "openvino", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rep = doc["placement"]
    (sp,) = rep["splits"]
    assert sp["nodes"] == ["cumprod"] and sp["found_by"] == "bisection" and sp["region_nodes"] == 4
    assert "prim::Constant" in sp["reason"]
    assert {f["op"] for f in rep["fallback_ops"]} == {"cumprod"}
    assert [g["nodes"] for g in rep["regions"]] == [2, 1]
    assert doc["max_abs_err"] < 1e-4
    text = cli("run", spec, "-b", "openvino")               # the table of left-out nodes says why
    assert "cumprod" in text.stdout and "openvino failed it inside a region" in text.stdout

    plan = tmp_path / "stick.opsplan"
    assert cli("compile", spec, "-b", "openvino", "-o", str(plan)).returncode == 0
    from opscope.runtime.passes.plan_file import load_plan
    from models.stick_breaking import factory
    model, inputs = factory()
    loaded = load_plan(plan, model=model, inputs=inputs)
    rep = loaded.plan.placement.report()
    assert rep["splits"] == []                              # nothing failed again: the plan knew
    assert {o["node"]: o["reason"] for o in rep["left_out"]}["cumprod"].startswith("openvino failed it inside a region")
    assert loaded.info["regions_loaded"] == 2 and loaded.info["regions_compiled"] == 0
    with torch.no_grad():
        want = model(*inputs).numpy()
    assert compare([loaded.executor.run(*inputs)[0]], [want])["max_abs"] < 1e-4


@pytest.mark.slow
def test_an_in_place_unet_is_one_onnxruntime_region():
    pytest.importorskip("onnxruntime")
    from models.unet import in_place_factory
    model, inputs = in_place_factory()
    s = open_session("unet", "onnxruntime", model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert [g["nodes"] for g in rep["regions"]] == [len(s.graph.nodes)], rep["left_out"]
    assert {"relu", "add", "div", "and", "fill"} <= set(rep["regions"][0]["ops"])
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


def test_onnxruntime_asks_the_exporters_registry_by_the_names_it_registers_ops_under():
    from opscope.runtime.backends.onnxruntime_backend import spellings
    assert "aten::__and_" in spellings("aten::__and__")
    assert "aten::relu" in spellings("aten::relu_") and "aten::index_put" in spellings("aten::index_put_")
    assert spellings("aten::linear") == ["aten::linear"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_under_torch_compile_an_op_openvino_fails_is_split_the_same_way():
    # NOTE: not the LSTM: dynamo leaves nn.LSTM to eager (allow_rnn), so no region of it reaches OpenVINO
    pytest.importorskip("openvino")
    from opscope.runtime.dynamo import compile as opscope_compile
    model, inputs = scan()
    compiled = opscope_compile(model, "openvino")
    with torch.no_grad():
        got, want = compiled(*inputs), model(*inputs)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert compare([g.numpy() for g in got], [want.numpy()])["max_abs"] < 1e-4
    placement = compiled.stats()["placement"]
    (sp,) = [sp for sp in placement["splits"] if "lgamma" in sp["ops"]]      # with _softmax: OpenVINO names both
    assert "aten::lgamma" in sp["reason"]
    assert {f["op"]: f["backend"] for f in placement["fallback_ops"]}["lgamma"] == "torch:cpu"
