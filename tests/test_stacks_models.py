"""transformers' BERT and ViT (small configs, random weights) on each compiler stack match eager within 1e-4, in
regions the placement report names; and a region that raises inside its stack at run time ends the run with
exit 1 and one line naming the region, its ops, the node the stack blamed and the backend, the run kept as
failed."""
import json

import pytest
import torch

from opscope.runtime.session import compare, open_session

STACKS = ["onnxruntime", "openvino", "xla"]


def bert():
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, max_position_embeddings=16, attn_implementation="sdpa")
    return BertForMaskedLM(cfg).eval(), (torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1)),)


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(0)
    cfg = ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, image_size=16,
                    patch_size=8, num_labels=10, attn_implementation="sdpa")
    return ViTForImageClassification(cfg).eval(), (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


@pytest.mark.slow
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("family", ["bert", "vit"])
def test_transformers_model_on_each_stack_matches_eager_in_named_regions(family, stack):
    pytest.importorskip("transformers")
    pytest.importorskip({"xla": "jax"}.get(stack, stack))
    model, inputs = {"bert": bert, "vit": vit}[family]()
    s = open_session(family, stack, model=model, inputs=inputs)
    rep = s.plan.placement.report()
    names = [g["name"] for g in rep["regions"]]
    assert names and names == [f"region{i}" for i in range(len(names))]
    assert all(g["backend"] == stack for g in rep["regions"])
    # the whole encoder layer in one program: attention, MLP and norms, not op by op
    assert {"linear", "layer_norm", "scaled_dot_product_attention"} <= {op for g in rep["regions"] for op in g["ops"]}
    assert max(g["nodes"] for g in rep["regions"]) >= 0.8 * len(s.plan.graph.nodes), rep["left_out"]
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


CRASHING = '''
import torch


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, idx):
        return self.fc(self.emb(idx)).relu()


def factory():
    torch.manual_seed(0)
    # token 30 of a 10-row table: capture sees only shapes; ONNX Runtime's Gather refuses it at run time
    return Lookup().eval(), (torch.tensor([[1, 2, 30]]),)
'''


@pytest.mark.multiprocess
def test_a_region_that_raises_inside_the_stack_is_exit_1_naming_the_region_and_the_run_is_kept_failed(cli, tmp_path):
    pytest.importorskip("onnxruntime")
    (tmp_path / "lookup.py").write_text(CRASHING)
    r = cli("profile", f"{tmp_path / 'lookup.py'}:factory", "-b", "onnxruntime", "--steps", "2")
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line
    assert "region region0 (3 nodes: embedding, linear, relu) failed inside onnxruntime" in line
    assert "at node embedding (embedding in emb)" in line and "indices element out of data bounds" in line
    runs = json.loads(cli("runs", "--json").stdout)["runs"]
    (run,) = [x for x in runs if x["model"].endswith("lookup.py:factory")]
    assert run["status"] == "failed" and "region region0" in run["error"] and run["run_id"] in line
