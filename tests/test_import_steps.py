"""Steps of an imported torch.profiler trace recorded without a schedule (no ProfilerStep#N): one per
optimizer step, whatever torch annotates around it -- Optimizer.zero_grad, DDP's forward, a user's own
record_function -- so six iterations are six steps (they were twelve, or eighteen under DDP)."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function


def _trace(path, iterations: int, user_annotation: bool = False, optimizer: bool = True):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(iterations):
            if user_annotation:
                with record_function("train_step"):
                    loss = m(torch.randn(8, 16)).sum()
                    loss.backward()
            else:
                loss = m(torch.randn(8, 16)).sum()
                if optimizer:
                    opt.zero_grad()
                loss.backward()
                if optimizer:
                    opt.step()
    p.export_chrome_trace(str(path))
    return path


@pytest.mark.parametrize("iterations", [3, 6])
def test_one_step_per_optimizer_step_not_per_torch_annotation(cli, tmp_path, iterations):
    r = cli("trace", "import", _trace(tmp_path / "t.json", iterations), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == iterations


def test_a_users_own_record_function_loop_still_makes_the_steps(cli, tmp_path):
    r = cli("trace", "import", _trace(tmp_path / "t.json", 4, user_annotation=True), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == 4
