"""`opscope migrate run` and `apply` on PyTorch's own DDP tutorial (tests/migrate_corpus/ddp_tutorial, from
pytorch/examples): integer gpu_id devices, torchrun with 2 ranks on the CPU. And the runtime redirect keeps
TorchScript working and answers torch.cuda.Event/Stream/get_device_properties on the CPU (issue 29)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torchrun_jobs import run_job

TUTORIAL = Path(__file__).with_name("migrate_corpus") / "ddp_tutorial"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _env():
    return {k: v for k, v in os.environ.items() if k != "OPSCOPE_DEVICE"}


def _trained(r) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    # both ranks print to one pipe: their lines can interleave, so count the messages, not whole lines
    assert sorted(re.findall(r"\[GPU([01])\] Epoch 0 \| Batchsize: 32 \| Steps: 32", r.stdout)) == ["0", "1"], r.stdout
    assert "Training snapshot saved" in r.stdout


def test_ddp_tutorial_readiness_is_below_100_before_apply(cli):
    r = cli("migrate", "scan", str(TUTORIAL), "--json")
    doc = json.loads(r.stdout)
    assert doc["readiness"] < 100 and doc["verified"] is False
    assert any("self.gpu_id" in f["api"] for f in doc["findings"])      # model.to(self.gpu_id): an int device


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ddp_tutorial_trains_on_cpu_after_apply_and_under_run(tmp_path, cli):
    after = tmp_path / "after"
    shutil.copytree(TUTORIAL, after)
    r = cli("migrate", "apply", str(after), "--write")
    assert r.returncode == 0, r.stderr
    text = (after / "multigpu_torchrun.py").read_text()
    assert "model.to(compat.device(self.gpu_id))" in text
    _trained(run_job([*TORCHRUN, "multigpu_torchrun.py", "1", "1"], cwd=after, timeout=240, env=_env()))
    plain = tmp_path / "plain"
    shutil.copytree(TUTORIAL, plain)
    _trained(run_job([sys.executable, "-m", "opscope.app", "migrate", "run", "--device", "cpu", "--",
                      *TORCHRUN, "multigpu_torchrun.py", "1", "1"], cwd=plain, timeout=240, env=_env()))
    # the snapshot rank 0 saved is loaded with map_location=f"cuda:{gpu_id}" on the next start
    r = run_job([sys.executable, "-m", "opscope.app", "migrate", "run", "--device", "cpu", "--",
                 *TORCHRUN, "multigpu_torchrun.py", "1", "1"], cwd=plain, timeout=240, env=_env())
    assert r.returncode == 0 and "Resuming training from snapshot at Epoch 0" in r.stdout, r.stderr[-3000:]


SCRIPTED = '''import torch
import torch.distributed.optim            # builds TorchScript functions that call torch factories


@torch.jit.script
def f(x):
    return torch.zeros(3) + x


print("scripted", f(torch.ones(3)).tolist())
print("eager", torch.zeros(2, device="cuda").device)
'''

TIMED = '''import torch
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
x = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")
end.record()
torch.cuda.synchronize()
print(f"matmul took {start.elapsed_time(end):.3f} ms")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = x + 1
s.synchronize()
free, total = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
print("memory", 0 < free <= total, p.total_memory == total, p.multi_processor_count >= 1, y.device)
'''


# cli_process: the script's own lines go to the stdout it inherits from the command's process
@pytest.mark.cli_process
@pytest.mark.multiprocess
@pytest.mark.parametrize("name, script, want", [
    ("scripted.py", SCRIPTED, [r"^scripted \[1\.0, 1\.0, 1\.0\]$", r"^eager cpu$"]),
    ("timed.py", TIMED, [r"^matmul took \d+\.\d{3} ms$", r"^memory True True True cpu$"]),
])
def test_migrate_run_keeps_torchscript_and_answers_cuda_events(tmp_path, cli, name, script, want):
    path = tmp_path / name
    path.write_text(script)
    r = cli("migrate", "run", "--device", "cpu", "--", sys.executable, str(path))
    assert r.returncode == 0, r.stderr[-3000:]
    for pattern in want:
        assert re.search(pattern, r.stdout, re.M), r.stdout


def test_collective_backend_follows_torchs_device_map(monkeypatch):
    from opscope.app.migrate import compat
    for device, backend in (("cpu", "gloo"), ("xpu", "xccl"), ("meta", "gloo")):
        monkeypatch.setenv(compat.ENV, device)
        assert compat.distributed_backend() == backend
