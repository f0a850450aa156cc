"""One clock per number (issue 27, item 3): a sim chip's step time is the chip's, whichever command asks.

The model has a gelu, which npu-a1 does not run: it falls back to numpy on the host. Its time on the
chip's timeline is modelled on a described host, so every command reads the same step, to the ns
(it used to add the gelu's host wall time: 79 ms one run, 136 ms the next)."""
import json

import pytest
from conftest import cli_in_process, run_cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 64)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))      # gelu: unsupported on npu-a1, runs on the host


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Net()

    def forward(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


def factory():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(16, 64),)


def train_factory():
    torch.manual_seed(0)
    return Loss(), (torch.randn(16, 64), torch.randn(16, 64))
'''


def _json(cli, *args):
    r = cli(*args, "--json")
    assert r.returncode == 0, (args, r.stderr)
    return json.loads(r.stdout)


def test_a_sim_step_is_the_same_to_the_ns_in_every_run_and_command(tmp_path):
    # NOTE: the commands run in this process (cli_in_process; `profile` still starts its runner) but the second
    # run, a fresh `opscope` process: a step read again in another process is the claim, and five more torch
    # imports (~6 s of CPU each) were what the test paid for the rest
    (tmp_path / "gm.py").write_text(MODEL)
    infer, train = str(tmp_path / "gm.py") + ":factory", str(tmp_path / "gm.py") + ":train_factory"
    chip = ("-b", "sim:npu-a1")
    first, second = _json(cli_in_process, "run", infer, *chip), _json(run_cli, "run", infer, *chip)
    assert first["clock"] == "simulated" and first["placement"]["fallback_ops"][0]["op"] == "gelu"
    step = first["step_ns"]
    assert step > 0 and second["step_ns"] == step
    prof = _json(cli_in_process, "profile", infer, *chip)
    assert (prof["step_ns"], prof["clock"]) == (step, "simulated")
    opt = _json(cli_in_process, "optimize", infer, *chip, "--cycles", "1", "-o", str(tmp_path / "gm.opsplan"))
    assert opt["clock"] == "simulated" and round(opt["baseline"]["step_seconds"] * 1e9) == step
    trained = _json(cli_in_process, "train", train, *chip, "--steps", "2")
    assert trained["clock"] == "simulated" and trained["step_ns"] > step       # forward, backward, optimizer
    assert _json(cli_in_process, "profile", train, "--train", *chip)["step_ns"] == trained["step_ns"]
    sim = _json(cli_in_process, "simulate", train, "--hybrid", "sim:npu-a1=1")
    assert sim["shares"][0]["compute_ns"] == trained["step_ns"] and sim["shares"][0]["clock"] == "simulated"


def test_a_bad_host_time_mode_is_one_line(cli):
    r = cli("run", "demo:mlp", "-b", "sim:npu-a1", env={"OPSCOPE_HOST_TIME": "sometimes"})
    assert r.returncode == 2 and "OPSCOPE_HOST_TIME" in r.stderr and len(r.stderr.strip().splitlines()) == 1
