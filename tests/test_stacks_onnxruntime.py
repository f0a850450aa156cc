"""onnxruntime[:PROVIDER]: demo:gpt as ONNX Runtime regions, matching eager; a refused op splits a block and
runs on the fallback; per-op child spans from ORT's own profile; bad specs and options exit 2 in one line."""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from opscope.runtime.regions import RegionProfile  # noqa: E402
from opscope.runtime.session import compare, open_session  # noqa: E402



def one_block():                 # as tests/test_regions.py: one GPT block, so a refused gelu splits it in two
    import torch

    from opscope.runtime.demos.gpt import GPT
    torch.manual_seed(0)
    return GPT(layers=1).eval(), (torch.randint(0, 2048, (2, 16)),)


def region_steps(s):
    return [st for st in s.plan.steps if st.node.op == "region"]


@pytest.mark.multiprocess
def test_demo_gpt_on_onnxruntime_is_one_region_and_matches_eager(cli):
    r = cli("run", "demo:gpt", "-b", "onnxruntime", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] < 1e-4
    rep = doc["placement"]
    assert [(g["name"], g["backend"], g["nodes"]) for g in rep["regions"]] == [("region0", "onnxruntime", 82)]
    assert rep["nodes_per_backend"] == {"onnxruntime": 82} and rep["left_out"] == [] and rep["transfers"] == 0


def test_a_description_refusing_gelu_gives_two_regions_and_gelu_on_the_fallback(tmp_path):
    chip = tmp_path / "ort-no-gelu.toml"
    chip.write_text('[backend]\nname = "ort-no-gelu"\nimplementation = "onnxruntime"\nfallback = "torch:cpu"\n'
                    '[backend.options]\nproviders = ["CPUExecutionProvider"]\nthreads = 1\n'
                    '[operators]\nunsupported = ["gelu"]\n')
    model, inputs = one_block()
    s = open_session("block", str(chip), model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert [g["name"] for g in rep["regions"]] == ["region0", "region1"]
    assert [f["op"] for f in rep["fallback_ops"]] == ["gelu"] and rep["fallback_ops"][0]["backend"] == "torch:cpu"
    assert [o["op"] for o in rep["left_out"]] == ["gelu"] and "unsupported" in rep["left_out"][0]["reason"]
    assert rep["transfers"] == 2            # region0 -> gelu -> region1: the edges are the only copies
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


def test_profile_gives_child_spans_per_op_mapped_back_to_the_region_members():
    s = open_session("demo:gpt", "onnxruntime")
    (st,) = region_steps(s)
    prof = RegionProfile()
    with s.executor.hooked(prof):
        s.run()
        s.run()
    children = prof.children[(1, "region0")]
    members = st.node.attrs["members"]
    mapped = {n for c in children for n in c.nodes}
    assert len(mapped) >= 0.9 * len(members)                # the fused and renamed ones included
    assert {c.region for c in children} == {"region0"} and {c.clock for c in children} == {"onnxruntime profiler"}
    by_name = {m.name: m for m in members}
    linear = next(c for c in children if "linear" in c.ops)
    assert linear.module_path == by_name[linear.nodes[0]].module_path and linear.flops > 0
    assert any(len(c.nodes) > 1 for c in children)          # a span ORT fused covers every node it ran
    assert all(c.start_ns <= c.end_ns for c in children)
    s.run()                                                 # unprofiled again: no spans, same values
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


def test_a_single_op_runs_as_a_region_of_one():
    from opscope.runtime.backends import resolve
    from opscope.runtime.capture import capture
    model, inputs = one_block()
    g = capture(model, inputs, name="block")
    b = resolve("onnxruntime")
    node = next(n for n in g.nodes if n.op == "layer_norm")
    x = np.random.default_rng(0).standard_normal(node.input_meta[0].shape).astype(np.float32)
    w, bias = (g.constant_slots[a.slot].numpy() for a in (node.args[2], node.args[3]))
    out = b.ops.kernel_for(node)(x, node.args[1], w, bias, node.args[4], node.args[5])
    ref = torch_layer_norm(x, w, bias)
    assert np.abs(out - ref).max() < 1e-5


def torch_layer_norm(x, w, b):
    import torch
    return torch.nn.functional.layer_norm(torch.from_numpy(x), w.shape, torch.from_numpy(w),
                                          torch.from_numpy(b)).numpy()


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec, says", [
    ("onnxruntime:CUDAExecutionProvider", "execution provider CUDAExecutionProvider is not available here"),
    ("onnxruntime:NoSuch", "NoSuchExecutionProvider is not available here"),
])
def test_a_provider_that_is_not_here_is_one_line_exit_2(cli, spec, says):
    r = cli("run", "demo:mlp", "-b", spec)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and spec in r.stderr and says in r.stderr


@pytest.mark.multiprocess
def test_an_option_the_validator_does_not_know_is_one_line_exit_2(cli, tmp_path):
    chip = tmp_path / "bad.toml"
    chip.write_text('[backend]\nname = "bad"\nimplementation = "onnxruntime"\n[backend.options]\nthreads = "four"\n')
    r = cli("run", "demo:mlp", "-b", chip)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "bad.toml: backend.options.threads: expected intra-op threads" in r.stderr


@pytest.mark.multiprocess
def test_onnxruntime_not_installed_is_listed_as_not_available_and_refused_in_one_line(cli, tmp_path):
    # a site folder where `import onnxruntime` fails, as it does where the package is not installed
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("raise ImportError('No module named onnxruntime')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    r = cli("backends", "--json", env=env)
    assert r.returncode == 0, r.stderr
    row = next(b for b in json.loads(r.stdout)["backends"] if b["spec"] == "onnxruntime")
    assert not row["available"] and "pip install onnxruntime" in row["reason"]
    r = cli("run", "demo:mlp", "-b", "onnxruntime", env=env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "pip install onnxruntime" in r.stderr
    r = cli("run", "demo:mlp", "-b", "numpy", "--json", env=env)     # nothing else breaks
    assert r.returncode == 0, r.stderr


@pytest.mark.multiprocess
def test_backends_lists_onnxruntime_with_its_providers(cli):
    r = cli("backends", "--json")
    row = next(b for b in json.loads(r.stdout)["backends"] if b["spec"] == "onnxruntime")
    assert row["available"] and "CPUExecutionProvider" in row["devices"]


def test_an_op_torchs_exporter_cannot_take_is_left_out_not_a_failed_region():
    import torch

    from opscope.runtime.backends.onnxruntime_backend import claim
    from opscope.runtime.graph import Node, Ref, TensorMeta
    meta = TensorMeta((4,), "float32")
    node = Node(0, "mse_loss_backward", "mse_loss_backward", torch.ops.aten.mse_loss_backward.default,
                (Ref(0), Ref(1), Ref(2), 1), {}, [0, 1, 2], [3], [meta] * 3, [meta])
    assert "no symbolic for aten::mse_loss_backward" in claim(node)
    node.op, node.target = "gelu", torch.ops.aten.gelu.default
    assert claim(node) is True


def test_bitwise_and_of_bools_is_claimed_as_its_logical_form_and_of_integers_refused_with_the_opset_why():
    """The exporter registers `&` only (ONNX's And: bools); bitwise_and's torch form is logical_and (Llama's mask),
    which would compute integers wrong, so integers stay on the fallback."""
    import torch

    from opscope.runtime.backends.onnxruntime_backend import claim
    from opscope.runtime.graph import Node, Ref, TensorMeta

    def node(dtype):
        m = TensorMeta((4,), dtype)
        return Node(0, "bitwise_and", "bitwise_and", torch.ops.aten.bitwise_and.Tensor, (Ref(0), Ref(1)), {},
                    [0, 1], [2], [m, m], [m])
    assert claim(node("bool")) is True
    assert "no bitwise and before opset 18" in claim(node("int64"))


@pytest.mark.multiprocess
def test_training_runs_the_forward_in_regions_and_the_backward_ops_onnx_cannot_export_on_the_fallback(cli):
    r = cli("train", "demo:mlp", "-b", "onnxruntime", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["within_tolerance"] and doc["tolerance"] <= 1e-4


@pytest.mark.multiprocess
def test_an_empty_batch_runs_on_the_fallback_instead_of_killing_the_process(tmp_path):
    """ONNX Runtime's im2col on an empty batch dies of SIGFPE (the whole process: nothing to split on): nodes with
    an empty input are not claimed, the run matches eager and says why. In a process of its own: the old code
    killed it."""
    from conftest import run_cli
    (tmp_path / "unfold.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.unfold(x, kernel_size=2) * 2\n"
        "def make():\n"
        "    return M(), (torch.randn(0, 1, 5, 5),)\n")
    r = run_cli("run", f"{tmp_path / 'unfold.py'}:make", "-b", "onnxruntime", "--json")
    assert r.returncode == 0, (r.returncode, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] == 0.0
    assert any("an input has no elements" in json.dumps(x) for x in doc["placement"]["left_out"]), doc["placement"]
