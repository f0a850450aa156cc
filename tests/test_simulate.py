"""`opscope simulate`: data-parallel step time at N ranks, checked against a hand computation (the tree and
the strategies: tests/test_simulate_strategies.py)."""
import json
import math

import pytest

from opscope.runtime.dist.simulate import Interconnect, all_reduce_seconds
from opscope.runtime.errors import UsageError

CHIP = """
[backend]
name = "linked"
implementation = "sim"
[hardware]
peak_flops = { float32 = 1.0e12 }
memory_bandwidth = 1.0e11
[interconnect]
bandwidth = 1.0e9
latency = 1.0e-5
topology = "ring"
"""
# demo:mlp: Linear(256, 512), Linear(512, 512), Linear(512, 10) with biases, float32 gradients
MLP_GRAD_BYTES = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)


def test_collective_cost_model_by_hand():
    ring = Interconnect(1e9, 1e-5, "ring")
    assert all_reduce_seconds(10**6, 1, ring) == 0.0
    assert math.isclose(all_reduce_seconds(10**6, 4, ring), 2 * 3 / 4 * 1e-3 + 6e-5)
    assert math.isclose(all_reduce_seconds(10**6, 8, Interconnect(1e9, 1e-5, "all-to-all")), 2 * 7 / 8 * 1e-3 + 2e-5)
    with pytest.raises(UsageError, match="topology"):
        Interconnect(1e9, 0, "mesh")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_simulate_at_1_8_1024_ranks_matches_the_hand_computation(cli, tmp_path):
    chip = tmp_path / "linked.toml"
    chip.write_text(CHIP)
    r = cli("simulate", "demo:mlp", "--hybrid", f"{chip}=1", "--ranks", "1", "--ranks", "8", "--ranks", "1024", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["gradient_bytes"] == MLP_GRAD_BYTES
    assert doc["interconnect"]["source"].startswith("[interconnect] of sim:linked")
    one, eight, big = doc["predictions"]
    compute = one["step_seconds"]                       # one rank: nothing to all-reduce
    assert one["communication_seconds"] == 0 and one["scaling_efficiency"] == 1.0 and compute > 0
    for p, n in ((eight, 8), (big, 1024)):
        ring = lambda b: 2 * (n - 1) / n * b / 1e9 + 2 * (n - 1) * 1e-5  # noqa: E731
        # the gradients' all-reduce, and the trainer's loss all-reduce and parameter check (16 B per rank + 16)
        comm = ring(MLP_GRAD_BYTES) + 2 * ring(8 * (1 + 3 * n))
        assert math.isclose(p["communication_seconds"], comm, rel_tol=1e-9)
        assert p["host_seconds"] == 0                    # a sim chip's step: no host time mixed in
        assert math.isclose(p["step_seconds"], compute + comm, rel_tol=1e-9)
        assert math.isclose(p["communication_share"], comm / (compute + comm), rel_tol=1e-9)
        assert math.isclose(p["scaling_efficiency"], compute / (compute + comm), rel_tol=1e-9)
    assert 0 < eight["communication_share"] < big["communication_share"] < 1
    assert any("weak scaling" in a for a in doc["assumptions"])
    # the flags override the description's link
    r = cli("simulate", "demo:mlp", "--hybrid", f"{chip}=1", "--ranks", "8", "--topology", "tree", "--json")
    p = json.loads(r.stdout)["predictions"][0]
    from opscope.runtime.dist.collectives import tree_all_reduce_seconds
    tree = tree_all_reduce_seconds(MLP_GRAD_BYTES, 8, 1e9, 1e-5)[0] + 2 * tree_all_reduce_seconds(8 * 25, 8, 1e9, 1e-5)[0]
    assert math.isclose(p["communication_seconds"], tree, rel_tol=1e-9)


@pytest.mark.parametrize("args, why", [(["--ranks", "0"], "--ranks: 0: give 1 or more"),
                                       (["--hybrid", "sim:nope=1"], "unknown sim backend"),
                                       (["--hybrid", "auto"], "fixed shares"),
                                       (["--bandwidth", "-1"], "bandwidth"),
                                       (["--ranks-per-node", "2", "--inter-link", "nan,1e-5"],
                                        "--inter-link 'nan,1e-5': interconnect bandwidth must be a positive")])
def test_simulate_bad_input_is_one_line_exit_2(cli, args, why):
    r = cli("simulate", "demo:mlp", *args)
    assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def _hybrid_run(store, step_s: float, optimizer: str, shard: str, overlap: bool, spec: str = "torch:cpu") -> str:
    """A finished `train --hybrid torch:cpu=0.5,torch:cpu=0.5` run of demo:mlp as train writes it in the store."""
    hybrid = f"{spec}=0.5,{spec}=0.5"
    run = store.create_run(model="demo:mlp", backend=f"hybrid:{hybrid}", engine="dist", steps=2,
                           config={"hybrid": hybrid, "backends": [spec] * 2})
    dist = {"world_size": 2, "optimizer": {"name": optimizer, "lr": 1e-3}, "shard": shard, "overlap": overlap,
            "step_seconds": step_s, "steps": [{"step": 0, "buckets": 1}, {"step": 1, "buckets": 1}]}
    store.update_run(run, config={"dist": dist})
    store.finish_run(run, "ok", None)
    return run


def test_the_measured_step_beside_a_prediction_is_a_run_of_the_same_optimizer_strategy_and_overlap(cli, tmp_path,
                                                                                                   monkeypatch):
    """Issue 39: the demo:gpt "measured" column came from an AdamW --shard gradients run while the prediction was
    for SGD data parallelism; now only a matching run is shown, with the prediction's error beside it."""
    from opscope.profiler import RunStore
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    store = RunStore()
    other = _hybrid_run(store, 0.5, "adamw", "gradients", False)
    # --one-process: the match with a run is the point here, not how the shares are timed (no process per rank)
    args = ("simulate", "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--ranks", "2", "--one-process",
            "--json")
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "measured" not in json.loads(r.stdout)["predictions"][0]
    assert json.loads(r.stdout)["timing"] == {"shares": "one process", "processes": 1, "why": "--one-process"}
    same = _hybrid_run(store, 0.04, "sgd", "", False)
    pred = json.loads(cli(*args).stdout)["predictions"][0]
    assert pred["measured"]["run_id"] == same
    assert pred["error"] == pytest.approx(pred["step_seconds"] / 0.04 - 1)
    r = cli(*args[:-1], "--measured", other)
    assert r.returncode == 2 and "optimizer adamw (predicted: sgd)" in r.stderr and "zero2" in r.stderr


def test_a_prediction_on_the_simulated_clock_is_not_compared_with_a_runs_wall_clock_step(cli, tmp_path, monkeypatch):
    """A run's step is the host's wall time; sim chips' shares predict on their simulated clock: the table says
    each one's clock, and no error is computed between the two."""
    from opscope.profiler import RunStore
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    run = _hybrid_run(RunStore(), 0.04, "sgd", "", False, spec="sim:npu-a1")
    args = ("simulate", "demo:mlp", "--hybrid", "sim:npu-a1=0.5,sim:npu-a1=0.5", "--ranks", "2")
    doc = json.loads(cli(*args, "--json").stdout)
    pred = doc["predictions"][0]
    assert doc["clock"] == "simulated" and pred["measured"]["run_id"] == run and pred["error"] is None
    # sim chips are timed in this process without --one-process: their clock does not share the host's cores
    assert doc["timing"]["shares"] == "one process" and "sim chip" in doc["timing"]["why"]
    assert pred["measured"]["clock"] == "wall"
    text = " ".join(cli(*args).stdout.split())
    assert "predicted: dp (compute on the simulated clock, collectives from the link model" in text
    assert "(wall)" in text and f"(run {run}, not compared)" in text and "error" not in text
    assert "not compared: a run's step is wall time, the prediction is on the simulated clock" in text
    assert "shares timed one process (not every share is a host rank" in text
