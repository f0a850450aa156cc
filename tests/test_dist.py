"""Hybrid data-parallel training over torch.distributed (gloo): runtime/dist."""
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from opscope.runtime import models
from opscope.runtime.description import parse
from opscope.runtime.dist.balance import Rebalancer, ratios_from_speed, split_rows
from opscope.runtime.dist.job import DistJob
from opscope.runtime.dist.thermal import ThermalModel
from opscope.runtime.errors import UsageError
from opscope.runtime.train import OptimizerSpec, eager_steps

HYBRID = "torch:cpu=0.7,sim:npu-a1=0.3"


def _eager_losses(spec, steps, lr=1e-2):
    model, inputs = models.load_train(spec)
    return eager_steps(model, inputs, OptimizerSpec("sgd", lr=lr), steps)["losses"]


def _assert_matches_full_batch(report, spec, steps):
    assert report["status"] == "ok", report["error"]
    assert len(report["steps"]) == steps
    for s in report["steps"]:                         # every rank held the same bits after every step
        assert s["identical"] and len(s["digests"]) == 2 and len(set(s["digests"].values())) == 1
    want = _eager_losses(spec, steps)
    assert np.max(np.abs(np.array(report["losses"]) - np.array(want))) <= 1e-4, (report["losses"], want)


# --- shares --------------------------------------------------------------------------------
def test_split_rows_places_every_row_once_and_gives_each_rank_one():
    assert split_rows([0.7, 0.3], 10) == [7, 3]
    assert split_rows([0.7, 0.3], 2) == [1, 1]
    assert split_rows([0.99, 0.01], 5) == [4, 1]
    assert sum(split_rows([0.2, 0.3, 0.5], 97)) == 97
    with pytest.raises(UsageError, match="cannot give each of 3 ranks a row"):
        split_rows([1, 1, 1], 2)


def test_ratios_follow_throughput():
    assert ratios_from_speed([300.0, 100.0]) == [0.75, 0.25]
    with pytest.raises(UsageError):
        ratios_from_speed([1.0, 0.0])


def test_rebalancer_waits_for_patience_then_moves_once_and_says_why():
    rb = Rebalancer([0.5, 0.5], tolerance=0.1, patience=2)
    assert rb.observe(0, [8, 8], [1.0, 1.05]) is None             # within tolerance
    assert rb.observe(1, [8, 8], [1.0, 3.0]) is None              # first unbalanced step: wait
    ch = rb.observe(2, [8, 8], [1.0, 3.0], ["", "throttled at 95 C, running 3x slower"])
    assert ch is not None and ch.rows == [12, 4] and ch.new == [0.75, 0.25]
    assert "rank 1" in ch.reason and "throttled" in ch.reason
    assert rb.observe(3, [12, 4], [3.0, 1.0]) is None             # quiet period after a move (hysteresis)
    assert rb.observe(4, [12, 4], [1.0, 1.0]) is None


# --- descriptions ----------------------------------------------------------------------------
BASE = {"backend": {"name": "hot", "implementation": "sim"},
        "hardware": {"peak_flops": {"float32": 1e12}, "memory_bandwidth": 1e11}}


def test_thermal_and_interconnect_tables_parse_and_bad_values_name_the_key():
    d = parse({**BASE, "thermal": {"tdp": 300, "throttle_temperature": 90, "throttle_slowdown": 3,
                                   "heating_rate": 100.0},
               "interconnect": {"bandwidth": 1e11, "latency": 5e-6, "topology": "tree"}}, "hot.toml")
    assert d.thermal["tdp"] == 300 and d.interconnect["topology"] == "tree"
    with pytest.raises(UsageError, match="thermal.heating_rate: missing"):
        parse({**BASE, "thermal": {"tdp": 300, "throttle_temperature": 90, "throttle_slowdown": 3}}, "x.toml")
    with pytest.raises(UsageError, match="thermal.throttle_slowdown"):
        parse({**BASE, "thermal": {"tdp": 1, "throttle_temperature": 90, "throttle_slowdown": 0.5,
                                   "heating_rate": 1}}, "x.toml")
    with pytest.raises(UsageError, match="interconnect.topology"):
        parse({**BASE, "interconnect": {"bandwidth": 1e9, "latency": 0, "topology": "mesh"}}, "x.toml")
    assert parse(BASE, "plain.toml").thermal == {}


def test_thermal_model_heats_with_work_and_throttles():
    t = ThermalModel(tdp=300, throttle_temperature=90, throttle_slowdown=3, heating_rate=50.0, ambient=40)
    assert t.advance(0.5) == 1.0 and t.temperature == 65
    assert t.advance(0.5) == 1.0 and t.throttled                  # reached 90 C
    assert t.advance(0.1) == 3.0 and t.sample()["throttled"]


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, why", [("torch:cpu=abc", "expected BACKEND=SHARE"),
                                       ("torch:cpu=0.7,torch:cpu=0.5", "sum to 1.2"),
                                       ("torch:cpu=0.7,sim:nope=0.3", "unknown sim backend"),
                                       ("torch:cpu=1,numpy=0", "must be > 0")])
def test_bad_hybrid_specs_are_usage_errors(text, why):
    with pytest.raises(UsageError, match=why):
        DistJob.parse("demo:mlp", text)


def test_two_ranks_may_share_a_backend():
    job = DistJob.parse("demo:mlp", "torch:cpu=0.7,torch:cpu=0.3")
    assert job.specs == ["torch:cpu", "torch:cpu"] and job.ratios == [0.7, 0.3]


@pytest.mark.multiprocess
def test_bad_hybrid_spec_on_the_command_line_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "opscope.app.hybrid", "demo:mlp", "--hybrid", "torch:cpu=x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--hybrid" in r.stderr


# --- two processes ----------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_unequal_shares_train_like_the_full_batch_with_identical_parameters():
    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.launch import launch
    job = DistJob.parse("demo:mlp", HYBRID, steps=3, timeout_s=30)
    result = launch(job)
    report = summarize(job, result.records, result.error)
    assert report["steps"][0]["rows"] == [22, 10]                # 32 rows split 0.7 / 0.3
    _assert_matches_full_batch(report, "demo:mlp", 3)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpt_two_process_hybrid_training_matches_full_batch(cli):
    r = subprocess.run([sys.executable, "-m", "opscope.app.hybrid", "demo:gpt", "--hybrid", HYBRID, "--steps", "5",
                        "--json"], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["engine"] == "gloo" and report["backends"] == ["torch:cpu", "sim:npu-a1"]
    _assert_matches_full_batch(report, "demo:gpt", 5)
    assert report["run_id"]                                     # the run is in the store, finished
    runs = json.loads(cli("runs", "--json").stdout)
    run = next(x for x in (runs["runs"] if isinstance(runs, dict) else runs) if x["run_id"] == report["run_id"])
    assert run["status"] == "ok"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpt_under_torchrun_matches_full_batch():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "opscope.app.hybrid", "demo:gpt", "--hybrid", HYBRID, "--steps", "5", "--json"],
                       capture_output=True, text=True, timeout=280, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(docs) == 1                                       # rank 0 reports, rank 1 stays quiet
    _assert_matches_full_batch(docs[0], "demo:gpt", 5)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_rank_that_dies_mid_run_stops_the_others_with_one_clear_line():
    from opscope.runtime.dist.launch import launch
    job = DistJob.parse("demo:mlp", "torch:cpu=0.5,sim:npu-a1=0.5", steps=200, timeout_s=30)

    def kill_rank_1(rec, procs):
        if rec.get("kind") == "step" and rec["rank"] == 1 and rec["step"] == 1:
            os.kill(procs[1].pid, signal.SIGKILL)

    result = launch(job, on_record=kill_rank_1)
    assert result.exit_codes[1] == -signal.SIGKILL and result.exit_codes[0] == 1
    assert result.error.startswith("rank 1 (sim:npu-a1) died (SIGKILL) after step 2 of 200")
    # the survivor stops in whichever all-reduce of step 3 it was in when its peer died (the gradients,
    # or the loss that follows them): timing decides which, the line names the collective and the step
    assert re.search(r"rank 0 \(torch:cpu\): all-reduce of the [a-z ]+ failed at step 3: ", result.error), \
        result.error
    assert "\n" not in result.error and "pair.cc" not in result.error
    steps = {(r["rank"], r["step"]) for r in result.of("step")}   # every record sent before the death is kept
    assert {(0, 0), (0, 1), (1, 0), (1, 1)} <= steps


# --- calibration and re-balancing ---------------------------------------------------------------
def _chip(tmp_path, name, peak, thermal=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[backend]\nname = "{name}"\nimplementation = "sim"\n[hardware]\n'
                    f'peak_flops = {{ float32 = {peak} }}\nmemory_bandwidth = {peak}\nlaunch_overhead = 0.0\n{thermal}')
    return str(path)


def _train(*args):
    r = subprocess.run([sys.executable, "-m", "opscope.app.hybrid", "demo:mlp", *args, "--json"],
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_auto_ratios_follow_peaks_3_to_1(tmp_path):
    fast, slow = _chip(tmp_path, "fast", 3e10), _chip(tmp_path, "slow", 1e10)
    report = _train("--hybrid", f"auto:{fast},{slow}", "--steps", "1")
    cal = [e for e in report["events"] if e["kind"] == "calibrate"]
    assert len(cal) == 1 and "probe" in cal[0]["reason"] and "3.00x" in cal[0]["reason"]
    assert abs(cal[0]["new_ratios"][0] - 0.75) <= 0.075 and abs(cal[0]["new_ratios"][1] - 0.25) <= 0.025
    assert report["steps"][0]["rows"] == [24, 8] and report["steps"][0]["identical"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_chip_that_throttles_mid_run_gets_a_smaller_share_and_the_event_says_why(tmp_path):
    thermal = ("[thermal]\ntdp = 300\nthrottle_temperature = 90\nthrottle_slowdown = 3\nheating_rate = 4000\n"
               "ambient = 40\n")
    hot, cool = _chip(tmp_path, "hot", 1e10, thermal), _chip(tmp_path, "cool", 1e10)
    report = _train("--hybrid", f"{hot}=0.5,{cool}=0.5", "--steps", "10", "--rebalance")
    steps = report["steps"]
    throttled_at = next(s["step"] for s in steps if s["thermal"]["0"]["throttled"])
    assert 0 < throttled_at < 8                                     # it ran cool first, then throttled
    moves = [e for e in report["events"] if e["kind"] == "rebalance"]
    assert len(moves) == 1                                          # hysteresis: one move, no oscillation
    move = moves[0]
    assert throttled_at <= move["step"] <= throttled_at + 3
    assert move["new_ratios"][0] < 0.5 and move["rows"][0] < 16
    assert "rank 0" in move["reason"] and "throttled" in move["reason"] and "3x slower" in move["reason"]
    assert all(s["rows"] == move["rows"] for s in steps if s["step"] > move["step"])
    assert all(s["identical"] for s in steps)


# --- multi-rank profiles -----------------------------------------------------------------------
def test_temporal_breakdown_overlap_and_slow_rank_by_hand():
    from opscope.profiler.ranks import Ranks
    ms = 1_000_000
    rows = [  # rank, step, op, start, end (ms)
        (0, 0, "linear", 0, 10), (0, 0, "all_reduce", 8, 14), (0, 0, "sgd", 16, 18),
        (1, 0, "linear", 0, 6), (1, 0, "gelu", 4, 7), (1, 0, "all_reduce", 7, 14),
    ]
    frame = {c: np.array([r[i] * (ms if i >= 3 else 1) if i >= 3 else r[i] for r in rows])
             for i, c in enumerate(["rank", "step", "op", "start_ns", "end_ns"])}
    ranks = Ranks(frame)
    b0, b1 = ranks.temporal_breakdown()
    assert (b0["window_s"], b0["compute_s"], b0["communication_s"]) == (0.018, 0.012, 0.006)
    assert (b0["overlap_s"], b0["exposed_communication_s"], b0["idle_s"]) == (0.002, 0.004, 0.002)
    assert (b1["compute_s"], b1["communication_s"], b1["overlap_s"], b1["idle_s"]) == (0.007, 0.007, 0.0, 0.0)
    assert ranks.slow_rank() == [{"step": 0, "slow_rank": 0, "compute_s": 0.012, "median_compute_s": 0.0095,
                                  "wait_s": pytest.approx(0.004), "lag_s": pytest.approx(0.003)}]
    assert ranks.overlap()[0]["overlap_ratio"] == pytest.approx(1 / 3)
    assert ranks.summary()["slowest_rank"] == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_every_rank_streams_into_one_run_and_the_slow_chip_is_named(tmp_path):
    from opscope.profiler.ranks import Ranks
    from opscope.profiler.store import RunStore
    fast, slow = _chip(tmp_path, "fast", 3e10), _chip(tmp_path, "slow", 1e9)
    report = _train("--hybrid", f"{fast}=0.5,{slow}=0.5", "--steps", "3")
    store = RunStore()
    ev = store.events_frame(report["run_id"], columns=["rank", "world_size", "step", "op", "start_ns", "end_ns"])
    assert set(ev["rank"].tolist()) == {0, 1} and set(ev["world_size"].tolist()) == {2}
    assert set(ev["op"].tolist()) == {"forward_backward", "all_reduce", "optimizer", "all_gather"}
    ranks = Ranks.of_run(store, report["run_id"])
    assert [r["slow_rank"] for r in ranks.slow_rank()] == [1, 1, 1]
    assert ranks.summary()["slowest_rank"] == 1
    assert all(r["communication_s"] > 0 and r["compute_s"] > 0 for r in ranks.temporal_breakdown())


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_hybrid_strategy_drives_the_same_training_from_python():
    from opscope.runtime.dist import train
    from opscope.runtime.hybrid import HybridStrategy
    report = train("demo:mlp", HybridStrategy(ratios={"numpy": 0.25, "sim:npu-a1": 0.75}), steps=2)
    assert report["steps"][0]["rows"] == [8, 24] and report["identical_parameters"]
    assert np.max(np.abs(np.array(report["losses"]) - np.array(_eager_losses("demo:mlp", 2)))) <= 1e-4


@pytest.mark.slow
@pytest.mark.multiprocess
def test_opscope_train_hybrid_from_the_cli(cli):
    """`opscope train MODEL --hybrid A=x,B=y` is the same engine, one line per step, ranks identical."""
    r = cli("train", "demo:mlp", "--hybrid", "torch:cpu=0.5,numpy=0.5", "--steps", "2", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json as _json
    doc = _json.loads(r.stdout)
    assert doc["run_id"] and doc["world_size"] == 2 and doc["backends"] == ["torch:cpu", "numpy"]
    assert len(doc["steps"]) == 2 and all(s["identical"] for s in doc["steps"]) and doc["identical_parameters"]
