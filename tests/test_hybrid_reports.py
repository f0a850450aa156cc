"""`train --hybrid` says what a user asks first: does it match one process (loss and parameters), how long a
step takes, which shares it really used; two ranks may run one backend; each rank gets its share of the
cores; a hung rank is called hung; a process count torchrun and the shares disagree on is one line, once."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "opscope.app"]


def test_two_cpu_ranks_equal_single_process_training_and_say_which_shares_they_used():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}     # the launcher decides
    r = subprocess.run([*CLI, "train", "demo:mlp", "--hybrid", "torch:cpu=0.7,torch:cpu=0.3", "--steps", "3",
                        "--json"], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["backends"] == ["torch:cpu", "torch:cpu"] and doc["identical_parameters"]
    ref = doc["single_process"]
    assert ref["loss_error"]["max_abs"] <= 1e-4 and ref["parameter_error"]["max_abs"] <= 1e-4
    assert ref["within_tolerance"] and len(ref["losses"]) == 3
    assert doc["step_seconds"] > 0
    # 0.7/0.3 of demo:mlp's 32 rows cannot be honoured exactly: whole rows, said so
    assert doc["shares"]["rows"] == [22, 10] and "whole rows" in doc["shares"]["note"]
    cores = len(os.sched_getaffinity(0))
    assert set(doc["threads_per_rank"].values()) == {max(1, cores // 2)}


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)


def test_a_stopped_rank_is_reported_as_hung_not_as_killed():
    p = subprocess.Popen([*CLI, "train", "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--steps", "100000",
                          "--timeout", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline and p.poll() is None:
            victim = next((c for c in _children(p.pid) if _rank_of(c) == "1"), None)
            time.sleep(0.2)
        assert victim is not None, "rank 1 never started"
        time.sleep(15)                       # past the start: the ranks are stepping
        os.kill(victim, signal.SIGSTOP)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert "rank 1 (torch:cpu) hung" in err and "SIGSTOP" in err and "died (SIGKILL)" not in err
    assert "Traceback" not in err


def test_a_process_count_the_shares_disagree_with_is_one_line_once():
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        "-m", "opscope.app", "train", "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5"],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode != 0
    assert (r.stdout + r.stderr).count("3 processes were started but --hybrid names 2 shares") == 1
    # bad input: every rank exits 2 (rank 0 after saying it). torchrun itself exits 1 whatever its ranks'
    # codes; its ChildFailedError names the first rank to exit, and that is where the 2 shows
    root = (r.stdout + r.stderr).partition("Root Cause")[2]
    assert re.search(r"rank\s*: \d \(local_rank: \d\)\s*exitcode\s*: 2 ", root), root[-1500:]


def _stderr_lines(r) -> list[str]:
    """What the user reads on stderr, without torchrun's own OMP_NUM_THREADS banner (W... run.py lines)."""
    return [line for line in r.stderr.splitlines() if line.strip() and "distributed/run.py" not in line]


def test_opscope_torchrun_gives_the_ranks_exit_2_and_their_one_line_alone(tmp_path):
    r = subprocess.run([*CLI, "torchrun", "--standalone", "--nproc-per-node", "3", "-m", "opscope.app", "train",
                        "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5"],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert _stderr_lines(r) == ["opscope: error: 3 processes were started but --hybrid names 2 shares (torch:cpu, "
                                "torch:cpu): start one process per share (torchrun --nproc-per-node 2)"], r.stderr
    # any other failure: one line naming the rank and how it ended, exit 1; torchrun's dump is not printed
    killer = tmp_path / "kill_rank_1.py"
    killer.write_text("import os, signal\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([*CLI, "torchrun", "--standalone", "--nproc-per-node", "2", str(killer)],
                       capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1 and "Root Cause" not in r.stderr, r.stderr
    assert len(_stderr_lines(r)) == 1 and re.match(r"opscope: error: rank 1 \(local rank 1, pid \d+\) of .*"
                                                   r"kill_rank_1.py died \(SIGKILL\)$", _stderr_lines(r)[0]), r.stderr
    # launcher arguments torchrun rejects, a script that is not there: one line, exit 2, no rank started
    # (the last three torchrun itself checks only after argparse: they were tracebacks' last lines and exit 1)
    for argv in (["--nproc-per-node"], ["--nproc-per-node", "2", str(tmp_path / "missing.py")],
                 ["--nproc-per-node", "abc", str(killer)], ["--nnodes", "3:1", str(killer)],
                 ["--rdzv-backend", "nosuch", "--nproc-per-node", "1", str(killer)]):
        r = subprocess.run([*CLI, "torchrun", *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(_stderr_lines(r)) == 1, r.stderr
        assert _stderr_lines(r)[0].startswith("opscope: error: torchrun: "), r.stderr
