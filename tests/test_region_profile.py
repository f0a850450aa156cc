"""`opscope profile -b onnxruntime|openvino` stores a region's per-op spans from the stack's own profiler as
child events of the region's event: ops, module paths, FLOPs, a parent and the stack's clock; most of the
region's nodes are covered, the children's time is the region's time, and `show --json` counts them."""
import json

import pytest

from opscope.profiler.store import RunStore


def profile(cli, backend: str) -> tuple[str, RunStore, dict]:
    r = cli("profile", "demo:gpt", "-b", backend, "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    store = RunStore()
    (config,) = store.query("SELECT config FROM runs WHERE run_id = ?", [run_id])[0]
    return run_id, store, json.loads(config)["placement"]


def events(store, run_id, depth):
    cols = ["step", "seq", "op", "node", "module", "flops", "parent", "clock", "start_ns", "end_ns", "source"]
    rows = store.query(f"SELECT {', '.join(cols)} FROM events WHERE run_id = ? AND depth = ? ORDER BY step, seq",
                       [run_id, depth])
    return [dict(zip(cols, r)) for r in rows]


@pytest.mark.multiprocess
def test_onnxruntime_profile_stores_each_regions_ops_beneath_it(cli):
    pytest.importorskip("onnxruntime")
    run_id, store, placement = profile(cli, "onnxruntime")
    (region,) = placement["regions"]
    regions, children = events(store, run_id, 0), events(store, run_id, 1)
    assert [(e["step"], e["op"], e["parent"], e["clock"]) for e in regions] == [(0, "region", "", ""),
                                                                                 (1, "region", "", "")]
    for parent in regions:
        mine = [c for c in children if c["step"] == parent["step"]]
        assert {(c["parent"], c["clock"]) for c in mine} == {("region0", "onnxruntime profiler")}
        covered = {n for c in mine for n in c["node"].split(",")}
        assert len(covered) >= 0.9 * region["nodes"]              # fused and renamed ORT nodes included
        assert all(parent["start_ns"] <= c["start_ns"] <= c["end_ns"] <= parent["end_ns"] for c in mine)
        measured = parent["end_ns"] - parent["start_ns"]
        assert abs(sum(c["end_ns"] - c["start_ns"] for c in mine) - measured) <= 0.1 * measured
        assert min(c["seq"] for c in mine) > parent["seq"]        # child seqs follow the plan's
    qkv = next(c for c in children if c["module"] == "h.0.attn.qkv" and c["op"].startswith("linear"))
    assert qkv["flops"] > 0 and qkv["source"].split()[0] in ("Gemm", "MatMul", "FusedMatMul")
    r = cli("show", run_id, "--by", "op", "--json")
    assert r.returncode == 0, r.stderr
    ops = {row["op"] for row in json.loads(r.stdout)["ops"]}
    assert {"region", "linear", "layer_norm", "scaled_dot_product_attention"} <= ops


@pytest.mark.multiprocess
def test_openvino_profile_stores_each_regions_ops_beneath_it(cli):
    pytest.importorskip("openvino")
    from opscope.runtime.backends.openvino_backend import CLOCK
    run_id, store, placement = profile(cli, "openvino")
    (region,) = placement["regions"]
    regions, children = events(store, run_id, 0), events(store, run_id, 1)
    assert [e["op"] for e in regions] == ["region", "region"]
    for parent in regions:
        mine = [c for c in children if c["step"] == parent["step"]]
        assert {(c["parent"], c["clock"]) for c in mine} == {("region0", CLOCK)}
        covered = {n for c in mine for n in c["node"].split(",") if c["op"] != c["source"].split()[0].lower()}
        assert len(covered) >= 0.5 * region["nodes"]
        assert all(parent["start_ns"] <= c["start_ns"] <= c["end_ns"] <= parent["end_ns"] for c in mine)
    assert any(c["flops"] > 0 and c["module"] for c in children)
