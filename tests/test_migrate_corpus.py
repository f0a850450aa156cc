"""`migrate apply` never makes a script worse: real-style training scripts (tests/migrate_corpus) run on
the CPU before and after `apply --write`, with and without OPSCOPE_DEVICE, and print the same losses;
a second apply changes nothing; the rewritten torchrun DDP script starts on CPU (gloo) where the
original stops at nccl."""
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

CORPUS = Path(__file__).with_name("migrate_corpus")
# script -> arguments that make the ORIGINAL run on a CPU-only machine (the rewritten one gets the same)
SCRIPTS = {"gpt_configurator.py": ["--device=cpu"], "imagenet_gpu.py": [], "mnist_flags.py": [],
           "multi_accelerator.py": []}


def _losses(script: Path, args, env=None) -> list[str]:
    e = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DEVICE"}
    e.update(env or {})
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, env=e,
                       cwd=script.parent)
    assert r.returncode == 0, f"{script.name} {args} {env}: {r.stderr[-2000:]}"
    losses = re.findall(r"^loss \d+ \S+$", r.stdout, re.M)
    assert losses, r.stdout
    return losses


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    before = root / "before"
    after = root / "after"
    shutil.copytree(CORPUS, before)
    shutil.copytree(CORPUS, after)
    r = subprocess.run([sys.executable, "-m", "opscope.app", "migrate", "apply", str(after), "--write", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rewritten"] > 0 and not doc["rolled_back"]
    return before, after, doc


@pytest.mark.multiprocess
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_rewritten_script_trains_like_the_original_on_cpu(rewritten, script):
    before, after, _ = rewritten
    args = SCRIPTS[script]
    want = _losses(before / script, args)
    assert (after / script).read_text() != (before / script).read_text(), "nothing was rewritten"
    assert _losses(after / script, args) == want
    assert _losses(after / script, args, {"OPSCOPE_DEVICE": "cpu"}) == want
    if script == "gpt_configurator.py":     # its default device is now the chosen one, and still a str
        assert _losses(after / script, []) == want


def test_rewrites_keep_types_and_other_accelerators(rewritten):
    _, after, _ = rewritten
    gpt = (after / "gpt_configurator.py").read_text()
    assert "device = compat.device_string()" in gpt                  # a str stays a str
    assert "compat.is_accelerator(device)" in gpt                    # 'cuda' in device
    assert "backend = compat.distributed_backend()" in gpt
    imagenet = (after / "imagenet_gpu.py").read_text()
    assert "compat.device(args.gpu)" in imagenet and "torch.device('cuda:" not in imagenet
    multi = (after / "multi_accelerator.py").read_text()
    assert "    if torch.cuda.is_available():\n" in multi              # its elif serves XPU: kept a CUDA check
    assert "torch.xpu.empty_cache()" in multi
    mnist = (after / "mnist_flags.py").read_text()
    assert "compat.is_accelerator(next(model.parameters()))" in mnist
    assert "compat.is_accelerator(device.type)" in mnist


@pytest.mark.multiprocess
def test_second_apply_changes_nothing(rewritten, tmp_path):
    _, after, _ = rewritten
    copy = tmp_path / "again"
    shutil.copytree(after, copy)
    r = subprocess.run([sys.executable, "-m", "opscope.app", "migrate", "apply", str(copy), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rewritten"] == 0 and doc["files"] == []
    assert doc["readiness"]["after"] >= doc["readiness"]["before"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_rewritten_ddp_script_starts_under_torchrun_on_cpu(rewritten):
    before, after, _ = rewritten
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DEVICE"}
    orig = subprocess.run([*torchrun, str(before / "ddp_torchrun.py")], capture_output=True, text=True, timeout=120,
                          env=env)
    assert orig.returncode != 0                      # nccl (and cuda:0) do not exist on this machine
    r = run_job([*torchrun, str(after / "ddp_torchrun.py")], timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(re.findall(r"^loss \d+ \S+$", r.stdout, re.M)) == 3


def test_an_apply_that_would_not_parse_is_rolled_back(tmp_path, monkeypatch):
    from opscope.app.migrate import rewrite as rw
    script = tmp_path / "t.py"
    script.write_text("import torch\nx = torch.zeros(1).cuda()\n")
    real = rw.rewrite

    def broken(path, scan):                # a rewrite bug that leaves invalid Python behind
        fr = real(path, scan)
        fr.after = fr.after + "def (:\n"
        return fr

    monkeypatch.setattr(rw, "rewrite", broken)
    import argparse
    from opscope.app.cli.migrate import apply_main
    code = apply_main(argparse.Namespace(path=str(script), write=True, json=False, max_size="2M"))
    assert code == 1
    assert script.read_text() == "import torch\nx = torch.zeros(1).cuda()\n"
    assert not (tmp_path / "t.py.orig").exists()


# cli_process: the script's own lines go to the stdout it inherits from the command's process
@pytest.mark.cli_process
@pytest.mark.multiprocess
def test_migrate_run_trains_an_unmodified_cuda_script_on_cpu(tmp_path, cli):
    script = tmp_path / "cuda_only.py"
    shutil.copy(CORPUS / "cuda_only.py", script)
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DEVICE"}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert plain.returncode != 0 and "needs CUDA" in plain.stderr
    r = cli("migrate", "run", "--device", "cpu", "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(re.findall(r"^loss \d+ \S+$", r.stdout, re.M)) == 3
    assert "device string kept: True on cpu" in r.stdout      # the script's own "cuda" strings still compare
    assert "CUDA calls run on cpu" in r.stderr


def test_migrate_run_refuses_bad_input_in_one_line(cli):
    for args, word in ((["migrate", "run"], "no command"), (["migrate", "run", "--", "no-such-exe-xyz"], "not found"),
                       (["migrate", "run", "--device", "warp9", "--", sys.executable, "-c", "pass"], "not a torch device")):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert word in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.multiprocess
def test_migrate_run_says_when_the_command_fails(cli):
    r = cli("migrate", "run", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 1 and "exited with code 3" in r.stderr
