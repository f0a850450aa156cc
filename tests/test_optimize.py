"""`opscope optimize`: baseline, cycles that apply the best applicable advice as a pass, keep what
helped; ends no worse than the baseline and writes a plan that loads. Advice -> pass mapping."""
from __future__ import annotations

import json

import pytest

from opscope.runtime import backends
from opscope.runtime.passes.advice import backend_with_passes, passes_for


def test_advice_maps_to_passes_and_a_backend_spec_switches_them_on():
    assert passes_for("fuse-elementwise") == ["fuse"] and passes_for("npu-conv-layout:x") == ["layout"]
    assert passes_for("reduced-precision") is None
    spec = backend_with_passes("sim:npu-a1", ["fuse", "memplan"])
    b = backends.resolve(spec)
    assert b.name == "sim:npu-a1" and b.description.passes["fuse"] and not b.description.passes["layout"]
    assert b.description.unsupported == backends.resolve("sim:npu-a1").description.unsupported
    n = backends.resolve(backend_with_passes("numpy", ["fuse"]))
    assert n.name == "numpy" and n.description.passes["fuse"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_optimize_gpt_on_sim_ends_no_worse_and_writes_a_plan_run_accepts(cli, tmp_path):
    out = tmp_path / "gpt.opsplan"
    r = cli("optimize", "demo:gpt", "-b", "sim:npu-a1", "--cycles", "3", "-o", out, "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["final"]["step_seconds"] <= doc["baseline"]["step_seconds"]
    assert 1 <= len(doc["cycles"]) <= 3 and doc["final"]["max_abs_err"] <= 1e-4
    fuse = next(c for c in doc["cycles"] if c["pass"] == "fuse")
    assert fuse["kept"] and fuse["measured_seconds"] == pytest.approx(fuse["estimated_seconds"], rel=1e-3)
    assert all(c["why"] and c["run_id"] for c in doc["cycles"])
    from opscope.runtime.passes.plan_file import open_plan_session
    s = open_plan_session(out, "demo:gpt")
    assert s.extra["plan"]["passes"] == doc["passes"]
    from opscope.profiler import RunStore
    cfg = RunStore().get_run(doc["run_id"])["config"]
    cfg = json.loads(cfg) if isinstance(cfg, str) else cfg
    assert [c["pass"] for c in cfg["optimize"]["cycles"]] == [c["pass"] for c in doc["cycles"]]


def test_optimize_bad_input_is_one_line_exit_2(cli, tmp_path):
    r = cli("optimize", "demo:mlp", "--cycles", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = cli("optimize", "demo:mlp", "--suite", tmp_path / "nope.txt")
    assert r.returncode == 2 and "suite file" in r.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_optimize_suite_on_numpy(cli, tmp_path):
    suite = tmp_path / "suite.txt"
    suite.write_text("# small models\ndemo:mlp\ndemo:cnn\n")
    r = cli("optimize", "x", "-b", "sim:npu-a1", "--suite", suite, "--cycles", "2", "-o", tmp_path / "p", "--json",
            timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [m["model"] for m in doc["models"]] == ["demo:mlp", "demo:cnn"]
    assert all(m["final"]["step_seconds"] <= m["baseline"]["step_seconds"] for m in doc["models"])


CHAINS = '''import torch


class Chains(torch.nn.Module):
    """A linear layer, then long chains of small elementwise ops: what fusion is for."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):
        h = self.fc(x)
        for _ in range(6):
            h = torch.tanh(h * 0.5 + 0.1) * 1.5 - 0.2
        return h


def factory():
    torch.manual_seed(0)
    return Chains().eval(), (torch.randn(512, 256),)
'''


@pytest.mark.multiprocess
@pytest.mark.slow
def test_advise_apply_of_fusion_advice_reports_estimate_and_measured_gain(cli, tmp_path):
    """The advisor's fusion advice is applicable: --apply re-runs with the fuse pass on and measures."""
    (tmp_path / "chains.py").write_text(CHAINS)
    r = cli("profile", f"{tmp_path / 'chains.py'}:factory", "-b", "sim:npu-a1", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    r = cli("advise", run_id, "--json")
    advice = {a["id"]: a for a in json.loads(r.stdout)["advice"]}
    assert advice["fuse-elementwise"]["apply"] == {"kind": "passes", "passes": "fuse"}
    r = cli("advise", run_id, "--apply", "fuse-elementwise", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    text = json.dumps(doc)
    assert "estimated" in text and "measured" in text
    new_run = doc["run_id"]
    assert new_run != run_id
    est = advice["fuse-elementwise"]["estimated_gain"]["seconds"]
    measured = doc.get("measured_gain", doc.get("measured", {}))
    secs = measured.get("seconds") if isinstance(measured, dict) else None
    assert est > 0 and secs is not None and secs > 0            # fusion paid off on the chip's clock


def test_optimize_never_overwrites_a_plan_unasked(cli, tmp_path, opscope_home):
    """A gpt.opsplan the user compiled is refused (one line, exit 2, the file byte-identical) without
    --force; the default plan goes beside the run store, not into the working folder."""
    mine = tmp_path / "gpt.opsplan"
    mine.write_bytes(b"the user's own plan")
    r = cli("optimize", "demo:mlp", "-b", "numpy", "-o", mine)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--force" in r.stderr
    assert mine.read_bytes() == b"the user's own plan"
    r = cli("optimize", "demo:mlp", "-b", "numpy", "--cycles", "1", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan == str(opscope_home / "plans" / "mlp.opsplan")
    r = cli("optimize", "demo:mlp", "-b", "numpy", "--cycles", "1", "--steps", "1")
    assert r.returncode == 2 and "mlp.opsplan already exists" in r.stderr
    r = cli("optimize", "demo:mlp", "-b", "numpy", "--cycles", "1", "--steps", "1", "-o", mine, "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert mine.read_bytes() != b"the user's own plan"
