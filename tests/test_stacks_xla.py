"""xla[:PLATFORM]: regions lowered to jax.numpy and jitted by XLA match eager; an op with no lowering and a
refused gelu stay on the fallback between regions; a platform jax lacks exits 2 in one line."""
import json

import pytest
import torch

pytest.importorskip("jax")

from opscope.runtime.demos.gpt import GPT  # noqa: E402
from opscope.runtime.session import compare, open_session  # noqa: E402


def one_block():                 # as tests/test_regions.py
    torch.manual_seed(0)
    return GPT(layers=1).eval(), (torch.randint(0, 2048, (2, 16)),)


def test_a_refused_gelu_gives_two_regions_and_gelu_on_the_fallback(tmp_path):
    chip = tmp_path / "xla-no-gelu.toml"
    chip.write_text('[backend]\nname = "xla-no-gelu"\nimplementation = "xla"\nfallback = "torch:cpu"\n'
                    '[operators]\nunsupported = ["gelu"]\n')
    model, inputs = one_block()
    s = open_session("block", str(chip), model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert [g["name"] for g in rep["regions"]] == ["region0", "region1"]
    assert [f["op"] for f in rep["fallback_ops"]] == ["gelu"]
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


class Cumulative(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        # cumprod: an op the xla backend has no lowering for (cumsum has one now)
        return torch.relu(self.fc(torch.cumprod(self.fc(x), dim=-1)))


def test_an_op_with_no_jax_lowering_is_left_out_with_the_reason_and_runs_on_the_fallback():
    torch.manual_seed(0)
    s = open_session("cumsum", "xla", model=Cumulative().eval(), inputs=(torch.randn(4, 8),))
    rep = s.plan.placement.report()
    assert [o["op"] for o in rep["left_out"]] == ["cumprod"]
    assert "no jax lowering for aten::cumprod" in rep["left_out"][0]["reason"]
    assert len(rep["regions"]) == 2 and rep["nodes_per_backend"]["torch:cpu"] == 1
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-5


@pytest.mark.multiprocess
def test_demo_gpt_on_xla_matches_eager_and_bad_specs_exit_2(cli, tmp_path):
    r = cli("run", "demo:gpt", "-b", "xla", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] < 1e-4 and [g["nodes"] for g in doc["placement"]["regions"]] == [82]
    r = cli("run", "demo:mlp", "-b", "xla:tpu")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "jax has no tpu platform here" in r.stderr
    chip = tmp_path / "x.toml"
    chip.write_text('[backend]\nname = "x"\nimplementation = "xla"\n[backend.options]\nthreads = 2\n')
    r = cli("run", "demo:mlp", "-b", chip)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "takes only [backend.options] device" in r.stderr
