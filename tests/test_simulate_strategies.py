"""`opscope simulate`'s collective formulas and parallel strategies, each against a hand computation
(runtime/dist/collectives.py, strategies.py), the model shape read off a real captured graph, bad
strategies as one line and exit 2, and the link measured by a real gloo all-reduce."""
import json
import math

import pytest

from opscope.runtime.dist.collectives import (Cluster, Interconnect, Level, all_gather_seconds, all_reduce_seconds,
                                              reduce_scatter_seconds, tree_all_reduce_seconds)
from opscope.runtime.dist.shape import Layer, ModelShape
from opscope.runtime.dist.strategies import Strategy, buckets, candidates, overlapped, plan, prefetched
from opscope.runtime.errors import UsageError

MB = 10 ** 6


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def test_ring_and_reduce_scatter_by_hand():
    ring = Interconnect(1e9, 1e-5, "ring")
    assert close(all_reduce_seconds(MB, 4, ring), 2 * 3 / 4 * 1e-3 + 6 * 1e-5)
    assert close(reduce_scatter_seconds(MB, 4, ring), 3 / 4 * 1e-3 + 3 * 1e-5)
    assert close(all_gather_seconds(MB, 4, ring), 3 / 4 * 1e-3 + 3 * 1e-5)
    assert all_reduce_seconds(MB, 1, ring) == 0 == reduce_scatter_seconds(MB, 1, ring)


def test_pipelined_tree_by_hand_and_it_never_loses_to_ring_at_two_ranks():
    # 8 ranks, d = 3, busiest link 2B: T(k) = 6(a + B/2kW) + (k-1)(a + 2B/kW) = (5+k)a + 2e-3 + 1e-3/k, best at k = 10
    seconds, k = tree_all_reduce_seconds(MB, 8, 1e9, 1e-5)
    assert k == 10 and close(seconds, 15e-5 + 2e-3 + 1e-4)
    assert close(all_reduce_seconds(MB, 8, Interconnect(1e9, 1e-5, "tree")), 2.25e-3)
    assert 2.25e-3 < 2 * 3 * (1e-3 + 1e-5) / 2       # less than half the unpipelined tree (reduce, then broadcast)
    # 2 ranks: the two trees' halves cross in opposite directions, k = 1: B/W + 2a, the ring's time exactly
    for nbytes, w, a in ((4096, 1e9, 1e-5), (MB, 1e9, 1e-5), (10 ** 9, 2.5e10, 5e-6)):
        tree = all_reduce_seconds(nbytes, 2, Interconnect(w, a, "tree"))
        assert close(tree, nbytes / w + 2 * a)
        assert close(tree, all_reduce_seconds(nbytes, 2, Interconnect(w, a, "ring")))
    # many ranks and a small message: the tree's log-depth latency beats the ring's 2(n-1) hops
    assert all_reduce_seconds(4096, 1024, Interconnect(1e10, 1e-5, "tree")) < \
        all_reduce_seconds(4096, 1024, Interconnect(1e10, 1e-5, "ring")) / 10


def test_hierarchical_all_reduce_by_hand():
    intra, inter = Interconnect(1e11, 1e-6, "ring"), Interconnect(1e10, 1e-5, "ring")
    c = Cluster.of(8, [Level(4, intra), Level(0, inter)])       # 4 ranks per node, 2 nodes
    assert c.ranks == 8 and [lv.size for lv in c.levels] == [4, 2]
    b = 10 ** 8
    rs_intra = 3 / 4 * b / 1e11 + 3 * 1e-6
    ar_inter = 2 * 1 / 2 * (b / 4) / (1e10 / 4) + 2 * 1e-5     # B/4 per rank, the node's link shared by its 4
    assert close(c.all_reduce(b), rs_intra + ar_inter + rs_intra)
    assert close(c.reduce_scatter(b), rs_intra + (1 / 2 * (b / 4) / (1e10 / 4) + 1e-5))
    # a tree between nodes: only the inter-node term changes
    t = Cluster.of(8, [Level(4, intra), Level(0, Interconnect(1e10, 1e-5, "tree"))])
    assert close(t.all_reduce(b), 2 * rs_intra + tree_all_reduce_seconds(b / 4, 2, 1e10 / 4, 1e-5)[0])
    with pytest.raises(UsageError, match="whole number of nodes"):
        Cluster.of(6, [Level(4, intra), Level(0, inter)])


# a made-up 4-layer model: every number below is easy to divide by hand
P = 4 * MB
SHAPE = ModelShape(model="toy", param_bytes=P, grad_bytes=P, state_bytes=2 * P, activation_bytes=8 * MB, tokens=100,
                   layers=[Layer(f"h.{i}", MB, MB, 0.0, 0.25, [(64, False), (32, False)]) for i in range(4)],
                   param_sizes=[MB // 2] * 8)
SHARE = {"backend": "x", "rows": 4, "forward_seconds": 0.01, "backward_seconds": 0.02, "optimizer_seconds": 0.004,
         "compute_seconds": 0.034, "host_seconds": 0.0, "clock": "simulated"}
LINK = Interconnect(1e9, 1e-5, "ring")


def flat(n):
    return Cluster([Level(n, LINK)])


def test_zero_memory_and_communication_by_hand():
    n = 4
    dp, z1, z2, z3 = (plan(Strategy(k), SHARE, SHAPE, flat(n)) for k in ("dp", "zero1", "zero2", "zero3"))
    A = 8 * MB
    assert dp["memory"] == {"parameters": P, "gradients": P, "optimizer_state": 2 * P, "activations": A,
                            "total": 4 * P + A}
    assert z1["memory"]["optimizer_state"] == 2 * P / n and z1["memory"]["gradients"] == P
    assert z2["memory"]["gradients"] == P / n and z2["memory"]["optimizer_state"] == 2 * P / n
    assert z3["memory"]["parameters"] == P / n + 2 * MB           # the shard, plus one layer gathered and one prefetched
    assert z3["memory"]["total"] == P / n + 2 * MB + P / n + 2 * P / n + A
    ar, rs = all_reduce_seconds(P, n, LINK), reduce_scatter_seconds(P, n, LINK)
    assert close(dp["exposed_communication_seconds"], ar) and close(dp["compute_seconds"], 0.034)
    assert close(z1["exposed_communication_seconds"], ar + rs)    # all-reduce, then all-gather the new parameters
    assert close(z1["compute_seconds"], 0.03 + 0.004 / n)          # each rank updates its shard
    assert close(z2["exposed_communication_seconds"], rs + rs)
    per_layer_ag, per_layer_rs = reduce_scatter_seconds(MB, n, LINK), reduce_scatter_seconds(MB, n, LINK)
    assert close(z3["exposed_communication_seconds"], 4 * per_layer_ag + 4 * (per_layer_ag + per_layer_rs))


def test_tensor_and_pipeline_parallel_by_hand():
    n = 4
    tp = plan(Strategy("tp", 2), SHARE, SHAPE, flat(n))
    assert tp["memory"] == {"parameters": P // 2, "gradients": P // 2, "optimizer_state": P, "activations": 4 * MB,
                            "total": 2 * P + 4 * MB}
    # one row-parallel linear per layer (the second of each pair, 32 outputs): its output all-reduced in
    # forward and backward inside the pair of ranks, for the 2 shares' tokens; gradients /2 over 2 dp peers
    act = 100 * 2 * 32 * 4
    assert SHAPE.row_parallel_outputs() == [32] * 4
    tp_s = 2 * 4 * all_reduce_seconds(act, 2, LINK)
    assert close(tp["exposed_communication_seconds"], tp_s + all_reduce_seconds(P / 2, 2, LINK))
    assert close(tp["compute_seconds"], 0.03 + 0.004 / 2)
    pp = plan(Strategy("pp", 2), SHARE, SHAPE, flat(n), microbatches=4)
    # 2 stages of 2 layers: (m + p - 1)/m x half the work of 2 shares = 5/4 x 0.03; the stage's optimizer
    assert close(pp["compute_seconds"], 5 / 4 * 0.5 * 2 * 0.03 + 0.004 / 2)
    send = 100 * 2 / 4 * 32 * 4                      # a microbatch's activations at the stage boundary (width 32)
    assert close(pp["exposed_communication_seconds"], 2 * 5 * (1e-5 + send / 1e9) + all_reduce_seconds(P / 2, 2, LINK))
    assert pp["memory"]["parameters"] == P / 2 and pp["memory"]["activations"] == 8 * MB * 0.5 * 2 * 2 / 4


def test_bucketed_overlap_hides_up_to_the_backward():
    # two buckets ready at half and all of a 10 s backward, 3 s each: the first ends at 8, the second at 13
    assert overlapped([(0.5, 3.0), (1.0, 3.0)], 10.0) == 3.0
    assert overlapped([(0.5, 8.0), (1.0, 1.0)], 10.0) == 4.0           # the first runs past the end: 5 + 8 + 1 - 10
    assert prefetched([(1.0, 2.0), (1.0, 2.0)]) == 1.0                 # only the first gather waits
    assert buckets([3, 3, 3, 3], 5) == [6, 6] and buckets([3, 3], 100) == [6]
    slow = Interconnect(1e8, 0.0, "ring")       # 2 ranks: 1 MB takes 10 ms, the backward 20 ms
    off = plan(Strategy("dp"), SHARE, SHAPE, flat(2).__class__([Level(2, slow)]))
    on = plan(Strategy("dp"), SHARE, SHAPE, Cluster([Level(2, slow)]), overlap=True, bucket_bytes=MB)
    assert close(off["exposed_communication_seconds"], 0.04)           # 4 MB after backward
    # 4 buckets of 1 MB ready at 5, 10, 15, 20 ms: 10 ms each back to back, the last ends at 45 ms
    assert close(on["exposed_communication_seconds"], 0.045 - 0.02)
    assert on["exposed_communication_seconds"] < off["exposed_communication_seconds"]


@pytest.mark.parametrize("text, ranks, why", [("tp=3", 2, "tp=3 does not fit 2 rank(s)"),
                                              ("pp=4", 2, "pp=4 does not fit 2 rank(s)"),
                                              ("pp=8", 8, "toy has 4 layer(s)"),
                                              ("tp=0", 2, "expected dp, zero1"),
                                              ("mesh", 2, "expected dp, zero1")])
def test_a_strategy_that_does_not_fit_is_a_usage_error(text, ranks, why):
    with pytest.raises(UsageError, match=why.replace("(", r"\(").replace(")", r"\)")):
        Strategy.parse(text).check(ranks, SHAPE)


def test_search_candidates_are_those_that_fit():
    names = [s.name for s in candidates(8, SHAPE)]
    assert names == ["dp", "zero1", "zero2", "zero3", "tp=2", "tp=4", "tp=8", "pp=2", "pp=4"]


def test_model_shape_of_demo_mlp_from_its_captured_graph():
    from opscope.runtime import models
    from opscope.runtime.dist.shape import model_shape
    from opscope.runtime.train.joint import capture_joint
    from opscope.runtime.train.step import OptimizerSpec, build_train_graph
    model, inputs = models.load_train("demo:mlp")
    train = build_train_graph(capture_joint(model, inputs, "demo:mlp"), OptimizerSpec("sgd"))
    s = model_shape("demo:mlp", train, inputs)
    params = 256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert s.param_bytes == s.grad_bytes == s.state_bytes == 4 * params         # sgd momentum: one buffer each
    assert [lay.name for lay in s.layers] == ["model.0", "model.2", "model.4"]
    assert [lay.param_bytes for lay in s.layers] == [4 * (256 * 512 + 512), 4 * (512 * 512 + 512), 4 * (512 * 10 + 10)]
    assert math.isclose(sum(lay.share for lay in s.layers), 1.0) and s.tokens == 32
    assert s.row_parallel_outputs() == [512, 512, 10] and s.width == 512
    assert 0 < s.activation_bytes < 10 * 32 * (256 + 512 + 512 + 10) * 4


@pytest.mark.parametrize("args, why", [(["--ranks", "2", "--strategy", "tp=3"], "tp=3 does not fit 2 rank(s)"),
                                       (["--strategy", "zero9"], "--strategy 'zero9': expected"),
                                       (["--ranks-per-node", "4"], "go together"),
                                       (["--ranks", "8", "--ranks-per-node", "4", "--inter-link", "fast"],
                                        "--inter-link 'fast'")])
def test_simulate_refuses_a_strategy_that_does_not_fit_in_one_line(cli, args, why):
    r = cli("simulate", "demo:mlp", "--hybrid", "numpy=1", *args)
    assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_simulate_pipeline_deeper_than_the_model_and_a_search(cli, tmp_path):
    from tests.test_simulate import CHIP
    chip = tmp_path / "linked.toml"
    chip.write_text(CHIP.replace("memory_bandwidth = 1.0e11", "memory_bandwidth = 1.0e11\nmemory_capacity = 5.0e6"))
    r = cli("simulate", "demo:mlp", "--hybrid", f"{chip}=1", "--ranks", "4", "--strategy", "pp=4")
    assert r.returncode == 2 and "demo:mlp has 3 layer(s) (model.0, model.2, model.4)" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    r = cli("simulate", "demo:mlp", "--hybrid", f"{chip}=1", "--ranks", "4", "--strategy", "search", "--json")
    assert r.returncode == 0, r.stderr
    ranked = json.loads(r.stdout)["search"]["4"]
    assert {p["strategy"] for p in ranked} == {"dp", "zero1", "zero2", "zero3", "tp=2", "tp=4", "pp=2"}
    fits = [p["fits"] for p in ranked]
    assert fits == sorted(fits, reverse=True) and True in fits and False in fits      # 5 MB per rank: dp does not
    assert not next(p for p in ranked if p["strategy"] == "dp")["fits"]
    ok = [p["step_seconds"] for p in ranked if p["fits"]]
    assert ok == sorted(ok)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_measure_link_with_gloo_is_stored_and_reused(cli):
    r = cli("simulate", "--measure-link", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    fit = json.loads(r.stdout)["measured_link"]
    assert fit["bandwidth"] > 0 and fit["latency"] >= 0 and fit["engine"] == "gloo" and len(fit["points"]) == 5
    for p in fit["points"]:          # the fitted line is printed beside every measured size
        assert p["measured_seconds"] > 0 and p["model_seconds"] > 0
    assert [p["bytes"] for p in fit["back_to_back"]["points"]] == [p["bytes"] for p in fit["points"]]
    r = cli("simulate", "demo:mlp", "--hybrid", "numpy=1", "--ranks", "2", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["interconnect"]["source"].startswith("measured on ")
    assert doc["interconnect"]["bandwidth"] == pytest.approx(fit["bandwidth"])


LEVELS = """
[backend]
name = "{name}"
implementation = "sim"
[hardware]
peak_flops = {{ float32 = 1.0e12 }}
memory_bandwidth = 1.0e11
[interconnect]
bandwidth = 1.0e11
latency = 1.0e-6
{levels}
"""


def test_a_description_gives_the_intra_and_inter_node_levels(tmp_path):
    from opscope.runtime import backends
    from opscope.runtime.dist.simulate import cluster_of, inter_node_of, link_of
    path = tmp_path / "pod.toml"
    path.write_text(LEVELS.format(name="pod", levels="ranks_per_node = 4\ninter_node_bandwidth = 1.0e10\n"
                                                     "inter_node_latency = 1.0e-5\ninter_node_topology = \"tree\""))
    chip = backends.resolve(str(path))
    per_node, inter = inter_node_of([chip])
    link = link_of([chip])
    assert per_node == 4 and (inter.bandwidth, inter.latency, inter.topology) == (1e10, 1e-5, "tree")
    c = cluster_of(8, link, inter, per_node)
    intra = Interconnect(1e11, 1e-6, "ring")
    by_hand = Cluster.of(8, [Level(4, intra), Level(0, Interconnect(1e10, 1e-5, "tree"))])
    assert [c_["ranks"] for c_ in c.describe()] == [4, 2] and close(c.all_reduce(10 ** 8), by_hand.all_reduce(10 ** 8))
    assert len(cluster_of(4, link, inter, per_node).levels) == 1         # one node: the intra-node link only
    bad = tmp_path / "half.toml"
    bad.write_text(LEVELS.format(name="half", levels="ranks_per_node = 4\ninter_node_bandwidth = 1.0e10"))
    with pytest.raises(UsageError, match="inter_node_latency.*missing"):
        backends.resolve(str(bad))


def test_ranks_past_the_cores_stretch_compute_host_work_and_the_loopback_link():
    from opscope.runtime.dist.simulate import Measured, predict
    wall = {**SHARE, "clock": "wall", "host_seconds": 0.005}
    m = Measured("toy", [wall] * 4, P, P // 4, [SHAPE] * 4, threads=1)
    alone = predict(m, 4, LINK)                                   # cores not given: nothing shared
    crowded = predict(m, 4, LINK, cores_per_node=2)               # 4 one-thread ranks on 2 cores: 2x
    slow = Interconnect(1e9 / 2, 2e-5, "ring")
    control = lambda link: 2 * all_reduce_seconds(8 * 13, 4, link)  # noqa: E731  (loss and parameter check)
    assert close(alone["step_seconds"], 0.034 + 0.005 + all_reduce_seconds(P, 4, LINK) + control(LINK))
    assert close(crowded["step_seconds"], 2 * 0.034 + 2 * 0.005 + all_reduce_seconds(P, 4, slow) + control(slow))
    assert "cores shared 2x" in crowded["cluster"][0]["source"]


@pytest.mark.parametrize("entry", [{"bandwidth": -1.0, "latency": 1e-5}, {"bandwidth": float("nan"), "latency": 0.0},
                                   {"bandwidth": True, "latency": 0.0}, {"bandwidth": 1e9, "latency": -1e-6}, "x"])
def test_a_damaged_stored_link_reads_as_never_measured(opscope_home, entry):
    import socket

    from opscope.runtime.dist import linkbench
    (opscope_home / "links.json").write_text(json.dumps({socket.gethostname(): entry}))
    assert linkbench.stored_link() is None
    (opscope_home / "links.json").write_text(" " * (linkbench.MAX_LINKS + 1))      # past the bound: not parsed
    assert linkbench.stored_link() is None
