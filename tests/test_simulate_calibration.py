"""Issue 39: the simulator calibrated the way the job runs. Shares timed together (one process per rank, in
lockstep: the cores shared, the slowest rank per step), the latency of the ranks' own small collective, the
link measured with as many ranks as predicted, and overlap that hides only what the free cores allow."""
import importlib.util
import math
from pathlib import Path

import pytest

from opscope.runtime.dist.collectives import Cluster, Interconnect, Level, all_reduce_seconds
from opscope.runtime.dist.shape import Layer, ModelShape
from opscope.runtime.dist.simulate import Measured, predict
from opscope.runtime.dist.strategies import Strategy, buckets, overlapped, plan
from opscope.runtime.dist.together import slowest_per_step, small_collective_seconds

MB = 2 ** 20
P = 4 * MB
SHAPE = ModelShape(model="toy", param_bytes=P, grad_bytes=P, state_bytes=2 * P, activation_bytes=8 * MB, tokens=100,
                   layers=[Layer(f"h.{i}", MB, MB, 0.0, 0.25, [(64, False), (32, False)]) for i in range(4)],
                   param_sizes=[MB // 2] * 8)
WALL = {"backend": "torch:cpu", "rows": 4, "forward_seconds": 0.01, "backward_seconds": 0.02,
        "optimizer_seconds": 0.004, "compute_seconds": 0.034, "host_seconds": 0.005, "clock": "wall"}
LINK = Interconnect(1e9, 1e-5, "ring")


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def test_the_job_pays_the_slowest_rank_per_step_and_the_last_arrival_times_the_collective():
    # runs: [gradient, optimizer, host, sync after backward, sync after the bookkeeping, the step] per step
    a = {**WALL, "runs": [[0.010, 0.001, 0.002, 0.005, 0.001, 0.030], [0.030, 0.001, 0.002, 0.001, 0.001, 0.040],
                          [0.010, 0.003, 0.002, 0.004, 0.002, 0.022]]}
    b = {**WALL, "runs": [[0.020, 0.002, 0.001, 0.001, 0.002, 0.028], [0.010, 0.002, 0.001, 0.021, 0.003, 0.039],
                          [0.012, 0.001, 0.004, 0.002, 0.001, 0.025]]}
    out = slowest_per_step([a, b])
    # per step the slower rank: gradients 20, 30, 12 ms -> median 20; optimizer 2, 2, 3 -> 2; host 2, 2, 4 -> 2
    assert close(out[0]["forward_seconds"] + out[0]["backward_seconds"], 0.020)
    assert close(out[0]["forward_seconds"] / 0.020, 1 / 3)              # split as the share's ops split it
    assert close(out[1]["optimizer_seconds"], 0.002) and close(out[1]["host_seconds"], 0.002)
    assert close(out[0]["compute_seconds"], 0.022) and out[0]["own_compute_seconds"] == 0.034
    # the longest step less the slowest phases, per meeting: (30 - 24) / 2, (40 - 34) / 2, (25 - 19) / 2 ms
    assert close(small_collective_seconds([a, b]), 0.003)


def test_ranks_timed_together_or_a_link_measured_with_them_pay_no_crowd_twice():
    alone = Measured("toy", [WALL] * 4, P, P // 4, [SHAPE] * 4, threads=1)
    together = Measured("toy", [WALL] * 4, P, P // 4, [SHAPE] * 4, threads=1, together=4)
    crowded = predict(alone, 4, LINK, cores_per_node=2)          # 4 one-thread ranks on 2 cores, timed alone: 2x
    assert close(crowded["compute_seconds"], 2 * 0.034)
    same = predict(together, 4, Interconnect(1e9, 1e-5, "ring", "measured", ranks=4), cores_per_node=2)
    assert close(same["compute_seconds"], 0.034) and close(same["host_seconds"], 0.005)
    assert same["cluster"][0]["bandwidth"] == 1e9 and "shared" not in same["cluster"][0]["source"]
    # timed with 2 ranks, predicted for 4 on 2 cores: the extra crowd only
    two = Measured("toy", [WALL] * 4, P, P // 4, [SHAPE] * 4, threads=1, together=2)
    assert close(predict(two, 4, LINK, cores_per_node=2)["compute_seconds"], 2 * 0.034)


def test_the_ranks_own_small_collective_sets_the_latency():
    m = Measured("toy", [WALL] * 2, P, P // 4, [SHAPE] * 2, threads=1, together=2, small_collective_seconds=0.004)
    p = predict(m, 2, LINK, cores_per_node=2)
    assert close(p["cluster"][0]["latency"], 0.004 / 2)                 # a 2-rank ring pays 2(n-1) latencies
    assert "own small all-reduce" in p["cluster"][0]["source"]
    control = next(c for c in p["collectives"] if "latency" in c["what"])
    used = Interconnect(1e9, 0.002, "ring")
    assert close(control["seconds"], 2 * all_reduce_seconds(8 * 7, 2, used))
    # predicted for another rank count than the one timed together: the link's own latency stays
    assert close(predict(m, 4, LINK, cores_per_node=8)["cluster"][0]["latency"], 1e-5)


def test_overlap_hides_only_what_the_free_cores_allow():
    slow = Cluster([Level(2, Interconnect(1e8, 0.0, "ring"))])     # 1 MiB takes 10.5 ms, the backward 20 ms
    share = {**WALL, "clock": "simulated"}
    full = plan(Strategy("dp"), share, SHAPE, slow, overlap=True, bucket_bytes=MB)
    none = plan(Strategy("dp"), share, SHAPE, slow, overlap=True, bucket_bytes=MB, hidden=0.0)
    t = all_reduce_seconds(MB, 2, slow.levels[0].link)
    assert close(full["exposed_communication_seconds"], overlapped([(k / 4, t) for k in (1, 2, 3, 4)], 0.02))
    # cores full: no byte work beside backward (a 1-byte message's time is the latency part: 10 ns here)
    assert math.isclose(none["exposed_communication_seconds"], 4 * t, rel_tol=1e-6)
    # latency is waiting, not work: it still hides with the cores full (4 buckets of 2 ms in a 20 ms backward)
    waits = Cluster([Level(2, Interconnect(1e15, 1e-3, "ring"))])
    latency = plan(Strategy("dp"), share, SHAPE, waits, overlap=True, bucket_bytes=MB, hidden=0.0)
    assert latency["communication_seconds"] > 0.008 and latency["exposed_communication_seconds"] < 0.0021
    m = Measured("toy", [WALL] * 2, P, P // 4, [SHAPE] * 2, threads=1, together=2)
    link = Interconnect(1e8, 0.0, "ring", "measured", ranks=2)
    busy = predict(m, 2, link, overlap=True, bucket_bytes=MB, cores_per_node=2)
    free = predict(m, 2, link, overlap=True, bucket_bytes=MB, cores_per_node=4)
    assert busy["overlap_hidden"] == 0.0 and free["overlap_hidden"] == 1.0
    grads = [next(c for c in p["collectives"] if "gradients" in c["what"]) for p in (busy, free)]
    assert math.isclose(grads[0]["exposed"], grads[0]["seconds"], rel_tol=1e-6)
    assert grads[1]["exposed"] < grads[1]["seconds"]
    assert "(4 buckets)" in grads[0]["what"] and buckets(SHAPE.param_sizes, MB) == [MB] * 4


def _bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dist.py"
    spec = importlib.util.spec_from_file_location("bench_dist", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_dist_gives_demo_gpt_a_batch_that_splits_over_4_ranks_and_refuses_a_mismatched_job():
    from opscope.runtime import models
    bench = _bench()
    assert bench.batch_for("demo:gpt", 2) == "demo:gpt" and bench.batch_for("demo:cnn", 4) == "demo:cnn"
    spec = bench.batch_for("demo:gpt", 4)
    model, (tokens, targets) = models.load_train(spec)
    assert tokens.shape == (4, 128) and targets.shape == (4, 128) and model(tokens, targets).dim() == 0
    m = Measured(spec, [{**WALL, "rows": 1}] * 4, P, P // 4, [SHAPE] * 4)
    job = {"model": spec, "optimizer": "sgd", "strategy": "dp", "overlap": False, "shares": [0.25] * 4}
    bench.check_match(job, m, False)
    with pytest.raises(SystemExit, match="prediction is for"):
        bench.check_match({**job, "optimizer": "adamw"}, m, False)


def test_bench_dist_prints_the_prediction_beside_what_the_ranks_measured():
    bench = _bench()
    m = Measured("toy", [WALL] * 2, P, P // 4, [SHAPE] * 2, threads=1, together=2, small_collective_seconds=0.002)
    p = predict(m, 2, Interconnect(1e9, 1e-5, "ring", "measured", ranks=2), overlap=True, bucket_bytes=MB,
                cores_per_node=2)
    job = {"exposed": 0.003, "phases": {"compute": 0.031, "slowest_compute": 0.033, "reduction": 0.012,
                                        "optimizer": 0.004, "check": 0.009}}
    line = bench.breakdown(p, job, {"bandwidth": 1e9, "latency": 1e-5, "ranks": 2})
    assert "predicted: fwd+bwd 30.0, optimizer 4.0, host 5.0" in line and "(hides 0%)" in line
    assert "measured: fwd+bwd 31.0 (slowest rank 33.0), reduction 12.0 (gradients exposed 3.0)" in line
    assert "latency used 1000 us" in line


@pytest.mark.multiprocess
@pytest.mark.slow
def test_shares_are_timed_together_in_one_process_per_rank():
    """Real processes: demo:mlp's 2 shares stepping in lockstep, and a link measured with 3 ranks."""
    from opscope.runtime.dist.linkbench import measure_link
    from opscope.runtime.dist.simulate import measure
    m = measure("demo:mlp", ["torch:cpu"] * 2, [0.5, 0.5], repeats=2, together=True)
    assert m.together == 2 and m.small_collective_seconds >= 0 and len(m.shapes) == 2
    assert [s["rows"] for s in m.shares] == [16, 16]
    for s in m.shares:       # every phase the slower rank's: the same on both, at least the share's own median
        assert len(s["runs"]) == 2 and s["compute_seconds"] == m.shares[0]["compute_seconds"]
        assert s["compute_seconds"] >= s["own_compute_seconds"] - 1e-12
    # sizes 4096x apart: 1 MiB's time did not always grow past 4 KiB's with 3 ranks on a loaded 2-core host
    fit = measure_link(sizes=(4096, 16 << 20), repeats=2, ranks=3)
    assert fit["ranks"] == 3 and len(fit["points"]) == 2 and fit["bandwidth"] > 0


RANK_MODULE = """
import json, os, sys, time
rank, mode = int(os.environ["RANK"]), os.environ["MODE"]
if mode == "noisy":       # a factory that prints a lot, a line past the bound, then the answer
    sys.stdout.write("x" * (9 << 20) + "\\n" + "@t not the answer\\n" * 3)
    sys.stderr.write("e" * 5000 + "\\n")
    print("@t " + json.dumps({"rank": rank, "world": int(os.environ["WORLD_SIZE"])}))
elif mode == "long":
    print("@t " + "1" * (9 << 20))
elif mode == "pickle":
    print("@t \\x80\\x04K\\x01.")
elif rank == 1:
    sys.exit("rank 1 broke here")
else:
    time.sleep(600)       # a peer waiting for the rank that failed: ended after the grace
"""


@pytest.mark.multiprocess
def test_local_ranks_answer_in_bounded_json_and_a_failed_rank_ends_the_others(tmp_path, monkeypatch):
    import os

    from opscope.runtime.dist import local_ranks
    from opscope.runtime.errors import ModelError
    (tmp_path / "fake_rank.py").write_text(RANK_MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = lambda mode, **kw: local_ranks.run_local_ranks(  # noqa: E731
        "fake_rank", 2, {**env, "MODE": mode}, "@t ", what="the fake ranks", timeout_s=300, **kw)
    assert run("noisy") == [{"rank": 0, "world": 2}, {"rank": 1, "world": 2}]
    assert run("noisy", answering=[0]) == [{"rank": 0, "world": 2}, None]
    with pytest.raises(ModelError, match="rank 0 answered with a line over"):
        run("long")
    with pytest.raises(ModelError, match="rank 0 answered with what is not JSON"):
        run("pickle")
    monkeypatch.setattr(local_ranks, "GRACE_S", 0.5)
    with pytest.raises(ModelError, match="the fake ranks failed: rank 1: rank 1 broke here"):
        run("fail")


@pytest.mark.parametrize("ranks, kept", [(3, 3), (0, 0), (True, 0), (2.0, 0), (10 ** 12, 0), ("4", 0)])
def test_a_stored_links_ranks_are_kept_only_when_they_are_a_rank_count(ranks, kept):
    from opscope.runtime.dist.simulate import link_of
    stored = {"bandwidth": 1e9, "latency": 1e-5, "ranks": ranks, "host": "h", "measured_at": "t"}
    assert link_of([], stored).ranks == kept
    assert link_of([], stored, bandwidth=2e9).ranks == 0          # a flag changed it: not what was measured


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["fifo", "damaged"])
def test_storing_a_link_over_a_fifo_or_a_damaged_file_neither_hangs_nor_refuses(opscope_home, what):
    import json
    import os
    import socket

    from opscope.runtime.dist import linkbench
    path = opscope_home / "links.json"
    os.mkfifo(path) if what == "fifo" else path.write_text("{not json")
    fit = {"host": socket.gethostname(), "bandwidth": 1e9, "latency": 1e-5, "ranks": 2}
    assert linkbench.save_link(fit) == str(path)
    assert json.loads(path.read_text()) == {fit["host"]: fit} and linkbench.stored_link() == fit


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "vit", "roberta", "t5", "wav2vec2"])
def test_a_share_of_each_training_architecture_is_timed_with_its_whole_shape(name):
    """Over tests/matrix_models.py's training corpus (picked for the stacks, not for this): the half-batch share
    on a sim chip carries every trainable parameter in its shape, and its phases on the chip's exact clock."""
    from matrix_models import TRAINING

    from opscope.runtime.dist.share_timer import ShareTimer, share_inputs
    model, inputs = TRAINING[name]()
    halves = share_inputs(inputs, [0.5, 0.5])
    assert [int(h[0].shape[0]) for h in halves] == [1, 1] and all(len(h) == len(inputs) for h in halves)
    timer = ShareTimer(model, name, "sim:npu-a1", halves[0], "sgd")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert timer.shape.param_bytes == sum(p.numel() * p.element_size() for p in trainable)
    assert sum(timer.shape.param_sizes) == timer.shape.grad_bytes == timer.shape.param_bytes
    s = timer.time(repeats=3)
    assert s["clock"] == "simulated" and s["rows"] == 1 and len(s["runs"]) == 1
    assert s["forward_seconds"] > 0 and s["backward_seconds"] > 0 and s["optimizer_seconds"] > 0
    assert type(s["compute_ns"]) is int and math.isclose(s["compute_ns"] / 1e9, s["compute_seconds"], rel_tol=1e-9)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_simulate_times_host_ranks_together_by_default_as_bench_dist_does(cli):
    """Issue 39: `simulate --hybrid torch:cpu=...` timed each share alone in its process while bench_dist.py timed
    them together (one process per rank, in lockstep), which moved its predicted/measured from 0.48-3.92 to
    0.71-2.10; the command now times them as the benchmark does (both call simulate.measure(together=True))."""
    import json
    r = cli("simulate", "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--ranks", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["timing"]["shares"] == "together" and doc["timing"]["processes"] == 2
    # each share's phases are the slower rank's per step (together.slowest_per_step), its own time kept beside
    assert [s["rows"] for s in doc["shares"]] == [16, 16]
    assert doc["shares"][0]["compute_seconds"] == doc["shares"][1]["compute_seconds"]
    assert all(s["compute_seconds"] >= s["own_compute_seconds"] - 1e-12 for s in doc["shares"])
    p = doc["predictions"][0]
    # the ranks' own small all-reduce set the link's latency at the rank count that was timed
    assert "timed together" in p["cluster"][0]["source"]
    assert any("timed together, 2 processes" in a for a in doc["assumptions"])
