"""plugins/opscope-iree: regions lowered torch -> MLIR (iree-turbine) and compiled by IREE for llvm-cpu, a backend
package built only on the public plugin API (opscope.runtime.plugin), found by its `opscope.backends` entry point.

demo:gpt and transformers' GPT-2 and BERT (tiny configs, random weights) match eager within 1e-4 in IREE regions;
a profiled run has per-op children under the region whose self times add up; training matches eager or reports
what IREE could not take as fallback; a region IREE fails to compile is split, not the end of the run."""
import json
from pathlib import Path

import pytest

from conftest import skip_unless_installed
from opscope.runtime import open_session, registry
from opscope.runtime.session import compare

skip_unless_installed("iree.compiler", "iree.runtime")    # imported when used (seconds at collection)
if registry.get("iree") is None:
    pytest.skip("plugins/opscope-iree is not installed: pip install -e plugins/opscope-iree", allow_module_level=True)

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "opscope-iree"


def test_the_plugin_is_registered_by_its_entry_point_and_uses_only_the_public_api():
    e = registry.get("iree")
    assert not e.builtin and e.dist == "opscope-iree" and e.kind == "regions" and not e.problem
    assert {"target", "device", "threads"} <= e.options.keys()
    assert e.options["target"]["choices"] == ["llvm-cpu", "cuda", "rocm", "vulkan-spirv"]
    for path in (PLUGIN / "opscope_iree").glob("*.py"):
        for line in path.read_text().splitlines():
            if "opscope." in line and "import" in line:
                assert "opscope.runtime.plugin" in line, f"{path.name}: {line.strip()}"


def test_a_rejected_option_is_one_line_exit_2(cli, tmp_path):
    desc = tmp_path / "iree-bad.toml"
    desc.write_text('[backend]\nname = "iree"\nimplementation = "iree"\nfallback = "numpy"\n'
                    '[backend.options]\ntarget = "x86-asm"\n')
    r = cli("run", "demo:gpt", "-b", str(desc))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "target" in r.stderr, r.stderr


def _regions_on_iree(s):
    rep = s.plan.placement.report()
    assert rep["regions"] and all(g["backend"] == "iree" for g in rep["regions"])
    return max(g["nodes"] for g in rep["regions"])


@pytest.mark.slow
@pytest.mark.multiprocess          # IREE's compiler runs as a process (iree-compile)
def test_a_small_model_runs_as_one_region_and_a_refused_member_is_split_off():
    import torch
    from opscope_iree import program

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))).softmax(-1)

    torch.manual_seed(0)
    model, inputs = Small().eval(), (torch.randn(3, 8),)
    s = open_session("small-iree", "iree", model=model, inputs=inputs)
    assert _regions_on_iree(s) == len(s.graph.nodes)
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-5

    # IREE refusing a member (here: its compiler made to fail on relu) splits the region there, as partition.py does
    real = program._compile

    def refuse_relu(region, opts):
        if any(m.op == "relu" for m in region.members):
            raise RuntimeError("error: 'torch.aten.relu' op failed to legalize (this test's IREE)")
        return real(region, opts)
    program._compile = refuse_relu
    try:
        s = open_session("small-iree-split", "iree", model=model, inputs=inputs)
    finally:
        program._compile = real
    on = {st.node.op: st.backend.name for st in s.plan.steps}
    assert on.get("relu") == "numpy" and on["region"] == "iree"
    split = s.plan.placement.report()["splits"][0]
    assert split["ops"] == ["relu"] and "aten::relu" in split["reason"]
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-5


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1800)         # IREE compiles each region in a process; minutes on a loaded 2-core machine
def test_demo_gpt_runs_and_profiles_with_per_op_children(cli, opscope_home):
    r = cli("run", "demo:gpt", "-b", "iree", "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["max_abs_err"] <= 1e-4 and run["backend"] == "iree"
    (region,) = run["placement"]["regions"]
    assert region["backend"] == "iree" and region["nodes"] >= 80
    r = cli("profile", "demo:gpt", "-b", "iree", "--steps", "2", "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    r = cli("show", json.loads(r.stdout)["run_id"], "--by", "op", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["op"]: row for row in json.loads(r.stdout)["ops"]}
    assert {"region", "linear", "layer_norm", "scaled_dot_product_attention"} <= set(rows)
    assert sum(row["self_ns"] for row in rows.values()) <= rows["region"]["total_ns"]
    assert rows["region"]["self_ns"] < 0.5 * rows["region"]["total_ns"]
    assert sum(row["share"] for row in rows.values()) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_transformers_gpt2_and_bert_match_eager_in_iree_regions(name):
    pytest.importorskip("transformers")
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    if name == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                           use_cache=False, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa"))
    else:
        model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     vocab_size=500, max_position_embeddings=64, attn_implementation="sdpa"))
    s = open_session(name, "iree", model=model.eval(), inputs=(torch.randint(0, 500, (2, 16)),))
    assert _regions_on_iree(s) >= 18                        # whole blocks in one program, not op by op
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(3000)         # a region IREE fails is bisected: a compile per step of the search
def test_demo_gpt_trains_like_eager_or_reports_what_iree_could_not_take(cli, opscope_home):
    r = cli("train", "demo:gpt", "-b", "iree", "--steps", "2", "--json", timeout=2900)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for a, e in zip(out["losses"], out["eager_losses"]):
        assert abs(a - e) <= 1e-4 * max(1.0, abs(e))
    assert out["within_tolerance"] and out["parameter_error"]["max_abs"] <= 1e-4
    rep = out["placement"]
    assert rep["nodes_per_backend"].get("iree", 0) > 0          # IREE ran regions of the step
    # what IREE failed to compile (its backward meets ops it cannot legalize) is on the fallback, with IREE's reason
    for f in rep["fallback_ops"]:
        assert f["backend"] == "numpy" and f["reason"]
