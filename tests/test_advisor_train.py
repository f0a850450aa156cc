"""Advisor rules that read a training run's phases, each on a real run."""
import pytest

from opscope.profiler import RunStore, profile
from opscope.profiler.advisor import report
from opscope.runtime import models


def _ids(advice):
    return {a.id for a in advice}


def test_training_analysis_reads_phases_and_memory_categories():
    model, inputs = models.load_train("demo:mlp")
    rid = profile("demo:mlp", "numpy", steps=2, model=model, inputs=inputs, train={"optimizer": "adamw"})
    a, advice = report(rid)
    t = a["train"]
    assert t["is_training"] and t["optimizer"] == "adamw" and t["optimizer_ops"] > 0
    assert t["forward_seconds"] > 0 and t["backward_seconds"] > 0 and t["optimizer_seconds"] > 0
    assert 0 < t["activation_share"] <= 1 and t["peak_bytes"] > 0
    # the rules agree with the numbers they read
    assert ("train-fused-optimizer" in _ids(advice)) == (t["optimizer_share"] > 0.15 and t["optimizer_ops"] > 8)
    assert ("train-activation-checkpointing" in _ids(advice)) == (t["activation_share"] > 0.5)


def test_inference_run_gets_no_training_advice():
    rid = profile("demo:mlp", "numpy", steps=1, model=models.load("demo:mlp")[0], inputs=models.load("demo:mlp")[1])
    a, advice = report(rid)
    assert not a["train"]["is_training"] and not any(i.startswith("train-") for i in _ids(advice))


@pytest.mark.multiprocess
def test_script_with_a_slow_input_pipeline_gets_input_pipeline_advice(cli, tmp_path):
    script = tmp_path / "slow_loader.py"
    script.write_text(
        "import time, torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(8, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(4):\n"
        "    time.sleep(0.2)                       # a slow, single-process input pipeline\n"
        "    x = torch.randn(4, 8)\n"
        "    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    r = cli("profile", "--json", "--", "python", script)
    assert r.returncode == 0, r.stderr
    import json
    rid = json.loads(r.stdout)["run_id"]
    a, advice = report(rid, RunStore())
    assert a["train"]["script"] and a["train"]["step_gaps"] == 3 and a["train"]["step_gap_seconds"] > 0.1
    assert "train-input-pipeline" in _ids(advice)


def test_optimizer_heavy_run_gets_fused_optimizer_advice():
    """Many small parameters, a tiny batch: the per-parameter optimizer ops are a large share of the step."""
    import torch

    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(12))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.square().mean()
    torch.manual_seed(0)
    # four steps: the first ones carry one-off costs in forward and backward, which made the share swing
    # 0.13-0.19 around the rule's 0.15 with two (a CI failure at 0.148); with four it is 0.25-0.27
    rid = profile("many", "numpy", steps=4, model=Many().train(), inputs=(torch.randn(1, 4),),
                  train={"optimizer": "adamw"})
    a, advice = report(rid)
    assert a["train"]["optimizer_ops"] == 12 * 2 + 1 and a["train"]["optimizer_share"] > 0.15, a["train"]
    assert "train-fused-optimizer" in _ids(advice)
