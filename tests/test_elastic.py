"""Elastic hybrid training (runtime/dist/elastic.py) under torchrun's own elastic agents: a node that dies
shrinks the job to 1 rank from the last checkpoint, a node that joins grows it back to 2, each change is a
scale event with its reason, and the parameters end where an uninterrupted run's do. Bad input (no
checkpoint folder, a hostile checkpoint) is one line, exit 2, and nothing in a checkpoint is executed."""
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from opscope.runtime.dist.elastic import CHECKPOINT, read_checkpoint, write_checkpoint
from opscope.runtime.errors import UsageError

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "opscope.app"]
HYBRID = "torch:cpu=0.5,torch:cpu=0.5"
STEPS, EVERY = 12, 2


def _env(**extra) -> dict:
    # torch 2.13's shared rendezvous store keeps round 0's MASTER_ADDR key: a node joining a later round
    # waits for it for ever (the agent that stayed is rank 0 already and never writes it again)
    return {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **extra}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(port: int, ckdir: Path, hold: Path, host: bool, log: Path) -> subprocess.Popen:
    """One torchrun agent (a 'node' of one rank). The agent that stays hosts the c10d store (is_host)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
           "--rdzv-conf", f"last_call_timeout=1,join_timeout=300,is_host={int(host)}", "--max-restarts", "3",
           "--monitor-interval", "0.2", "-m", "opscope.app", "train", "demo:mlp", "--hybrid", HYBRID,
           "--steps", str(STEPS), "--elastic", "--checkpoint-dir", str(ckdir), "--checkpoint-every", str(EVERY),
           "--json"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, start_new_session=True,
                            env=_env(OPSCOPE_ELASTIC_HOLD=str(hold)))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _kill_node(p: subprocess.Popen) -> None:
    for c in _children(p.pid):          # torchrun starts each rank in its own session
        try:
            os.killpg(c, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def _wait_checkpoint(ckdir: Path, deadline: float, nodes, **want):
    """The checkpoint once its meta holds `want` (step, world_size, number of events)."""
    while time.monotonic() < deadline:
        for n in nodes:
            assert n.poll() is None, f"a node exited ({n.returncode}) while waiting for {want}"
        try:
            ck = read_checkpoint(str(ckdir))
        except UsageError:          # never half a file (os.replace); a transient read error only
            ck = None
        if ck is not None and all((len(ck.meta["events"]) if k == "events" else ck.meta[k]) == v
                                  for k, v in want.items()):
            return ck
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint with {want} in time")


@pytest.mark.slow
def test_a_job_shrinks_when_a_node_dies_grows_when_one_joins_and_ends_where_an_uninterrupted_run_does(tmp_path):
    ckdir, hold, port = tmp_path / "ck", tmp_path / "hold", _free_port()
    ckdir.mkdir()
    hold.write_text("4")                     # the ranks wait before step 4 (after its checkpoint)
    # the uninterrupted run: the same job through opscope's own launcher (2 ranks all along)
    ref_dir = tmp_path / "ref"
    ref = subprocess.Popen([*CLI, "train", "demo:mlp", "--hybrid", HYBRID, "--steps", str(STEPS), "--elastic",
                            "--checkpoint-dir", str(ref_dir), "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=_env(OPSCOPE_HOME=str(tmp_path / "home")))
    a = _node(port, ckdir, hold, True, tmp_path / "a.log")
    time.sleep(1)
    b = _node(port, ckdir, hold, False, tmp_path / "b.log")
    nodes = [a, b]
    deadline = time.monotonic() + 400
    try:
        _wait_checkpoint(ckdir, deadline, nodes, step=4, world_size=2)
        _kill_node(b)                        # node b goes away: its rank dies with it
        nodes = [a]
        hold.write_text("8")                 # rank 0 fails its next collective; torchrun re-forms the job with 1 rank
        _wait_checkpoint(ckdir, deadline, nodes, step=8, world_size=1, events=1)
        c = _node(port, ckdir, hold, False, tmp_path / "c.log")
        nodes = [a, c]                       # a new node joins: a's agent restarts its rank, 2 ranks again
        _wait_checkpoint(ckdir, deadline, nodes, step=8, world_size=2, events=2)
        hold.unlink()
        out, _ = a.communicate(timeout=max(1, deadline - time.monotonic()))
        assert a.returncode == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert c.wait(timeout=60) == 0, (tmp_path / "c.log").read_text()[-3000:]
        ref_out, ref_err = ref.communicate(timeout=max(1, deadline - time.monotonic()))
        assert ref.returncode == 0, ref_err[-2000:]
    finally:
        for n in (a, b, *nodes, ref):
            if n.poll() is None:
                _kill_node(n)
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    scale = [e for e in report["events"] if e["kind"] == "scale"]
    assert [(e["direction"], e["from_ranks"], e["to_ranks"], e["step"]) for e in scale] == \
        [("shrink", 2, 1, 4), ("grow", 1, 2, 8)]
    # the survivor's own line is the reason (gloo words the dead peer 'Connection closed' or 'reset by peer')
    assert "1 rank(s) left (rank 0 of 2 saw: " in scale[0]["reason"] and "failed at step 5" in scale[0]["reason"]
    assert "joined" in scale[1]["reason"] and scale[0]["rows"] == [32] and scale[1]["rows"] == [16, 16]
    assert report["world_size"] == 2 and [s["step"] for s in report["steps"]] == list(range(8, STEPS))
    assert report["single_process"]["within_tolerance"]
    # the final checkpoint against the uninterrupted run's, parameter by parameter
    final, want = read_checkpoint(str(ckdir)), read_checkpoint(str(ref_dir))
    assert final.step == want.step == STEPS and final.meta["resumes"] == 2
    assert set(final.parameters) == set(want.parameters)
    worst = max(float(np.max(np.abs(final.parameters[k] - want.parameters[k]))) for k in want.parameters)
    assert worst <= 1e-4, worst
    # the run in the store lists the scale events too
    shown = subprocess.run([*CLI, "show", report["run_id"], "--json"], capture_output=True, text=True,
                           timeout=120, env=_env())
    assert shown.returncode == 0, shown.stderr[-1000:]
    stored = [e for e in json.loads(shown.stdout)["run"]["config"]["dist"]["events"] if e["kind"] == "scale"]
    assert [(e["direction"], e["reason"]) for e in stored] == [(e["direction"], e["reason"]) for e in scale]


def _one_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def test_elastic_without_a_checkpoint_folder_is_one_line_once(tmp_path):
    r = subprocess.run([*CLI, "train", "demo:mlp", "--hybrid", HYBRID, "--elastic"], capture_output=True, text=True,
                       timeout=120, env=_env())
    assert r.returncode == 2
    assert "--elastic needs --checkpoint-dir" in _one_line(r)


class _Trap:
    """Unpickling this writes a file: a loader that ran pickle would leave it behind."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _mlp_checkpoint(folder: Path, **change) -> Path:
    """A well-formed checkpoint of demo:mlp's parameters (as opscope writes it), optionally altered."""
    from opscope.runtime import models
    model, _ = models.load_train("demo:mlp")
    params = {k: v.detach().numpy() for k, v in model.named_parameters()}
    params.update(change)
    meta = {"model": "demo:mlp", "hybrid": HYBRID, "steps": 6, "step": 2, "world_size": 2, "resumes": 0, "events": []}
    folder.mkdir(exist_ok=True)
    return Path(write_checkpoint(str(folder), meta, params, {}))


def _hostile(kind: str, folder: Path, trap: Path) -> None:
    if kind == "pickle":
        (folder / CHECKPOINT).write_bytes(pickle.dumps(_Trap(str(trap))))
    elif kind == "pickle-inside-npz":
        path = _mlp_checkpoint(folder)
        import zipfile
        with zipfile.ZipFile(path, "a") as z:           # an object array's .npy is a pickle
            with z.open("param/evil.npy", "w") as f:
                np.lib.format.write_array(f, np.array([_Trap(str(trap))], dtype=object), allow_pickle=True)
    elif kind == "truncated":
        path = _mlp_checkpoint(folder)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "wrong-shapes":
        _mlp_checkpoint(folder, **{"model.0.weight": np.zeros((3, 3), np.float32)})


# the CLI's two routes: refused before any rank starts (a pickle), or by the ranks once the model is built (its
# shapes); the reader's other refusals (truncated, a pickle inside the .npz) are the same line, tested below
@pytest.mark.parametrize("kind", ["pickle", "wrong-shapes"])
def test_a_hostile_checkpoint_is_one_line_exit_2_and_nothing_in_it_runs(tmp_path, kind):
    folder, trap = tmp_path / "ck", tmp_path / "trap"
    folder.mkdir()
    _hostile(kind, folder, trap)
    r = subprocess.run([*CLI, "train", "demo:mlp", "--hybrid", HYBRID, "--steps", "6", "--elastic",
                        "--checkpoint-dir", str(folder)], capture_output=True, text=True, timeout=240,
                       env=_env(OPSCOPE_HOME=str(tmp_path / "home")))
    assert r.returncode == 2, r.stderr[-2000:]
    line = _one_line(r)
    assert f"--checkpoint-dir {folder}: {CHECKPOINT}" in line and "delete it or pass another folder" in line
    assert not trap.exists()


def test_a_checkpoint_round_trips_and_its_reader_refuses_what_opscope_does_not_write(tmp_path):
    path = _mlp_checkpoint(tmp_path / "ok")
    ck = read_checkpoint(str(path.parent))
    assert ck.step == 2 and ck.meta["world_size"] == 2 and "model.0.weight" in ck.parameters
    assert read_checkpoint(str(tmp_path / "none")) is None
    # a sharded rank reads only its own entries, after every header matched the model's
    want = {k: np.broadcast_to(np.zeros((), v.dtype), v.shape) for k, v in ck.parameters.items()}
    assert set(ck.load("param", want, keep={"model.0.weight"})) == {"model.0.weight"}
    want["model.2.bias"] = np.zeros(want["model.2.bias"].shape + (2,), np.float32)
    with pytest.raises(UsageError, match="holds parameter model.2.bias as"):
        ck.load("param", want, keep={"model.0.weight"})
    trap = tmp_path / "trap"
    for kind in ("pickle", "pickle-inside-npz", "truncated"):
        folder = tmp_path / kind
        folder.mkdir()
        _hostile(kind, folder, trap)
        with pytest.raises(UsageError, match="delete it or pass another folder"):
            read_checkpoint(str(folder))
    assert not trap.exists()


def test_an_elastic_job_runs_the_first_shares_of_any_world_up_to_its_shares_and_stops_after_max_restarts(tmp_path):
    from opscope.runtime.dist.elastic import check_resumable, shares_for
    from opscope.runtime.dist.job import DistJob, mismatch
    from opscope.runtime.errors import ModelError
    job = DistJob.parse("demo:mlp", "torch:cpu=0.6,numpy=0.4", steps=6, elastic=True,
                        checkpoint_dir=str(tmp_path / "ck"), max_restarts=1)
    assert shares_for(job, 1) == (["torch:cpu"], [1.0]) and shares_for(job, 2) == (["torch:cpu", "numpy"], [0.6, 0.4])
    assert mismatch(job, 1) is None and mismatch(job, 2) is None
    assert "an elastic job runs 1 to 2 ranks" in mismatch(job, 3)
    assert check_resumable(job, 2) is None                          # no checkpoint yet: a fresh start
    _mlp_checkpoint(tmp_path / "ck")                                # resumed 0 times: may resume once
    assert check_resumable(job, 2).step == 2
    path = tmp_path / "ck" / CHECKPOINT
    ck = read_checkpoint(str(path.parent))
    write_checkpoint(str(path.parent), {**ck.meta, "resumes": 1}, ck.parameters, ck.state)
    with pytest.raises(ModelError, match=r"resumed 1 times \(--max-restarts 1\)"):
        check_resumable(job, 2)
    other = DistJob.parse("demo:gpt", "torch:cpu=0.6,numpy=0.4", steps=6, elastic=True,
                          checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(UsageError, match="is of model 'demo:mlp', not 'demo:gpt'"):
        check_resumable(other, 2)
    # sharding resumes too: the checkpoint holds every shard's state (tests/test_hybrid_zero2.py re-shards one)
    assert DistJob.parse("demo:mlp", "torch:cpu=0.5,numpy=0.5", elastic=True, checkpoint_dir="x",
                         shard="optimizer").shard == "optimizer"
    with pytest.raises(UsageError, match="--checkpoint-dir is for --elastic"):
        DistJob.parse("demo:mlp", "torch:cpu=0.5,numpy=0.5", checkpoint_dir="x")


def test_a_checkpoint_entry_that_claims_more_than_it_holds_is_refused_before_numpy_allocates(tmp_path):
    import zipfile
    path = _mlp_checkpoint(tmp_path)
    header = {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)}   # 4 TB, from a few bytes
    with zipfile.ZipFile(path, "a") as z:
        with z.open("param/huge.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, header)
            f.write(b"\0" * 16)
    with pytest.raises(UsageError, match=r"claims \[1000000000000\] float32 but holds"):
        read_checkpoint(str(tmp_path))
