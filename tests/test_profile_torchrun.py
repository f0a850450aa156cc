"""`opscope profile -- torchrun ...`: an unchanged DDP job (examples/ddp_train.py, gloo, 2 ranks), every rank
profiled into one multi-rank run, collectives with their bytes, and the Ranks analysis naming the slow rank."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opscope.profiler import RunStore
from opscope.profiler.ranks import Ranks

ROOT = Path(__file__).resolve().parents[1]
DDP = str(ROOT / "examples" / "ddp_train.py")
pytestmark = pytest.mark.multiprocess


def _profile(*command, timeout=240, home=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}          # one thread per rank: the machine has 2 cores
    if home is not None:
        env["OPSCOPE_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "opscope.app", "profile", "--json", "--", *command], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slow_rank_job(tmp_path_factory):
    """`opscope profile -- torchrun` on the shipped DDP script, rank 1 sleeping 0.4 s before each step."""
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    home = tmp_path_factory.mktemp("torchrun-home")
    p = _profile("torchrun", "--nproc-per-node", "2", DDP, "--steps", "4", "--slow-rank", "1", "--delay", "0.4",
                 home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    return RunStore(home / "runs.duckdb"), json.loads(p.stdout)


def test_torchrun_ddp_job_is_one_run_with_both_ranks_and_names_the_slow_rank(slow_rank_job):
    store, doc = slow_rank_job
    assert doc["status"] == "ok" and doc["world_size"] == 2
    assert set(doc["events_per_rank"]) == {"0", "1"} and all(n > 20 for n in doc["events_per_rank"].values())
    run = store.get_run(doc["run_id"])
    assert run["engine"] == "dist" and "wall" in run["config"]["clock"]
    # every rank's DDP buckets, each span with the bucket's bytes (the model's parameters: 32*64+64+64*8+8)
    buckets = store.query("SELECT rank, count(*), min(bytes), sum(bytes) FROM events WHERE run_id = ? AND "
                          "op = 'all_reduce' AND source = 'ddp bucket' GROUP BY rank ORDER BY rank", [doc["run_id"]])
    params = (32 * 64 + 64 + 64 * 8 + 8) * 4
    assert [r[0] for r in buckets] == [0, 1]
    assert all(n == 4 and total == 4 * params for _, n, _, total in buckets)
    assert Ranks.of_run(store, doc["run_id"]).summary()["slowest_rank"] == 1 == doc["slowest_rank"]
    # the fast rank spent the straggler's delay waiting in the all-reduce, the slow one did not
    comm = {r: 0 for r in (0, 1)}
    for c in doc["collectives"]:
        comm[c["rank"]] += c["time_ns"]
    assert comm[0] > comm[1]


def test_the_ranks_page_names_the_slow_rank_of_the_torchrun_job(slow_rank_job):
    from test_web_ranks import _callback, find, text_of

    from opscope.app.web.server import create_app
    store, doc = slow_rank_job
    body = _callback(create_app(store=store), "ranks-summary", {"run": doc["run_id"], "status": "ok", "events": 1,
                                                                 "dropped": 0})
    summary = json.loads(body)["response"]["ranks-summary"]["children"]
    assert text_of(find(summary, "ranks-slowest")).startswith("Slowest rank: rank 1 —")
    assert text_of(find(summary, "ranks-clock")).startswith("Clock: wall")


def test_python_m_torch_distributed_run_is_profiled_the_same_way():
    p = _profile(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", DDP, "--steps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["world_size"] == 2 and set(doc["events_per_rank"]) == {"0", "1"}
    ops = {(c["rank"], c["op"]) for c in doc["collectives"] if c["bytes"] > 0}
    assert {(0, "all_reduce"), (1, "all_reduce")} <= ops
    assert "loss" in p.stderr                # the job's own output goes to stderr beside --json


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_a_job_whose_ranks_record_nothing_exits_1_saying_why():
    p = _profile("torchrun", "--nproc-per-node", "1", "--no-python", "true", timeout=120)
    assert p.returncode == 1
    assert "no rank recorded anything" in p.stderr and "Traceback" not in p.stderr
    assert RunStore().list_runs() == []
