"""torch backends run every ATen and custom op torch can execute, mapped by opscope or not (issue 12.1).

The models under tests/models/ use ops opscope has no op for (or had none when this was
written): ConvTranspose2d + bilinear upsampling, LSTM/GRU, weight norm, topk/sort/histc/index_put_,
and a library's own custom op. On torch:cpu each runs through the command line and matches eager.
"""
import json
from pathlib import Path

import pytest
import torch

from opscope.runtime import models
from opscope.runtime.backends import resolve
from opscope.runtime.capture import capture

MODELS = Path(__file__).parent / "models"
SPECS = ["unet.py:factory", "recurrent.py:lstm", "recurrent.py:gru", "weight_norm.py:factory",
         "routing.py:factory", "custom_op.py:factory"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_torch_cpu_runs_the_model_through_the_cli(cli, spec):
    r = cli("run", f"{MODELS / spec}", "--backend", "torch:cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] <= 1e-5, doc
    assert doc["placement"]["nodes_per_backend"] == {"torch:cpu": doc["nodes"]}


@pytest.mark.parametrize("spec, ops", [
    ("unet.py:factory", {"conv_transpose2d", "upsample_bilinear2d"}),
    ("recurrent.py:lstm", {"lstm"}),
    ("weight_norm.py:factory", {"_weight_norm"}),
    ("routing.py:factory", {"topk", "sort", "histc", "index_put_"}),
])
def test_torch_cpu_claims_the_ops_the_model_needs(spec, ops):
    """The registry asks torch itself: whether or not opscope maps these ops, torch:cpu runs them."""
    model, inputs = models.load(f"{MODELS / spec}")
    graph = capture(model, inputs)
    found = {n.target.overloadpacket.__name__ for n in graph.nodes}     # ATen names, mapped by opscope or not
    assert ops <= found, found
    torch_cpu = resolve("torch:cpu")
    refused = {n.op: torch_cpu.ops.supports(n) for n in graph.nodes if torch_cpu.ops.supports(n) is not True}
    assert not refused


def test_custom_op_keeps_its_namespace_and_runs_on_torch():
    model, inputs = models.load(f"{MODELS / 'custom_op.py'}:factory")
    graph = capture(model, inputs)
    gate = [n for n in graph.nodes if "scaled_gate" in n.op]
    assert [n.op for n in gate] == ["opscopetest:scaled_gate"]      # never labelled aten:...
    assert resolve("torch:cpu").ops.supports(gate[0]) is True
    assert resolve("numpy").ops.supports(gate[0]) == "no opscope op for opscopetest:scaled_gate"


def test_torch_cpu_still_refuses_what_its_description_marks_unsupported(tmp_path):
    p = tmp_path / "cpu.toml"
    p.write_text('[backend]\nname = "cpu-no-linear"\nimplementation = "torch"\ndevice = "cpu"\n'
                 '[operators]\nunsupported = ["linear"]\n')
    model, inputs = models.load(f"{MODELS / 'custom_op.py'}:factory")
    graph = capture(model, inputs)
    b = resolve(str(p))
    verdict = {n.op: b.ops.supports(n) for n in graph.nodes}
    assert verdict["linear"] == "linear is marked unsupported in the description"
    assert verdict["opscopetest:scaled_gate"] is True


def test_torch_backend_passes_through_only_real_op_overloads():
    """A node whose target is not a torch op (a fused node, a Python callable) is not torch's to run."""
    from opscope.runtime.graph import Node, TensorMeta

    meta = TensorMeta((2,), "float32")
    node = Node(index=0, name="n", op="aten:mystery", target=lambda x: x, args=(), kwargs={}, inputs=[],
                outputs=[0], input_meta=[meta], output_meta=[meta], attrs={})
    assert resolve("torch:cpu").ops.supports(node) == "no opscope op for aten:mystery"
    node.target = torch.ops.aten.relu.default
    assert resolve("torch:cpu").ops.supports(node) is True
