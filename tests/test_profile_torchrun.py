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


# --- issue 39: the reports of a profiled DDP job say what the script did --------------------------------------

def _cli(home, *args):
    p = subprocess.run([sys.executable, "-m", "opscope.app", *args], env={**os.environ, "OPSCOPE_HOME": str(home)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_a_c10d_collective_counts_the_bytes_it_sends_not_input_and_output(slow_rank_job):
    store, doc = slow_rank_job
    rows = store.query("SELECT DISTINCT bytes FROM events WHERE run_id = ? AND op = 'c10d:allreduce_' AND "
                       "phase = 'backward'", [doc["run_id"]])
    params = (32 * 64 + 64 + 64 * 8 + 8) * 4          # one bucket: every gradient, sent once
    assert [r[0] for r in rows] == [params]


def test_self_time_never_exceeds_total_and_collectives_are_communication(slow_rank_job):
    store, doc = slow_rank_job
    home = store.path.parent
    for by in ("name", "op", "category"):
        ops = json.loads(_cli(home, "show", doc["run_id"], "--by", by, "--json"))["ops"]
        assert ops and all(o["self_ns"] <= o["total_ns"] for o in ops), [(o["key"], o["self_ns"], o["total_ns"])
                                                                          for o in ops]
    cats = {o["key"]: o for o in json.loads(_cli(home, "show", doc["run_id"], "--by", "category", "--json"))["ops"]}
    assert "communication" in cats and "host" in cats
    comm = store.query("SELECT count(*) FROM events WHERE run_id = ? AND (op = 'all_reduce' OR op LIKE 'c10d:%')",
                       [doc["run_id"]])[0][0]
    assert cats["communication"]["count"] == comm


def test_four_script_steps_are_four_steps(slow_rank_job):
    store, doc = slow_rank_job
    assert doc["steps"] == 4 and store.get_run(doc["run_id"])["steps"] == 4
    steps = store.query("SELECT rank, count(DISTINCT step) FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank",
                        [doc["run_id"]])
    assert steps == [(0, 4), (1, 4)]


def test_show_json_names_the_slow_rank(slow_rank_job):
    store, doc = slow_rank_job
    shown = json.loads(_cli(store.path.parent, "show", doc["run_id"], "--json"))
    assert shown["slowest_rank"] == 1 and shown["others_waited_s"] > 0
    assert [r["rank"] for r in shown["ranks"]] == [0, 1]


def test_trace_export_puts_each_rank_in_its_own_process_with_named_threads(slow_rank_job, tmp_path):
    store, doc = slow_rank_job
    out = tmp_path / "job.json"
    _cli(store.path.parent, "trace", "export", doc["run_id"], "-o", str(out))
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["rank 0", "rank 1"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    buckets = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "X" and e["name"] == "all_reduce"}
    assert {procs[pid] for pid, _ in buckets} == {"rank 0", "rank 1"}     # one track per rank, not one for both
    assert all(threads[b].startswith("collectives (rank ") for b in buckets)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
@pytest.mark.timeout(600)
def test_an_unchanged_fsdp2_job_records_its_all_gathers_and_reduce_scatters_per_rank(tmp_path):
    r = _profile("torchrun", "--nproc-per-node", "2", str(ROOT / "examples" / "fsdp2_train.py"), timeout=540,
                 home=tmp_path / "home")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["world_size"] == 2 and doc["steps"] == 3 and set(doc["events_per_rank"]) == {"0", "1"}
    comm = {(c["rank"], c["op"]): c for c in doc["collectives"]}
    for rank in (0, 1):
        gathers = [c for (rk, op), c in comm.items() if rk == rank and "allgather" in op.replace("_", "")]
        scatters = [c for (rk, op), c in comm.items() if rk == rank and "reduce_scatter" in op]
        # 3 steps x 4 FSDP units (3 layers and the root's leftovers), forward and backward: some of each, every rank
        assert gathers and sum(c["count"] for c in gathers) >= 6 and all(c["bytes"] > 0 for c in gathers), comm
        assert scatters and sum(c["count"] for c in scatters) >= 3, comm
    assert not any("copy_in" in op or "copy_out" in op for _, op in comm)     # FSDP's local copies are compute
