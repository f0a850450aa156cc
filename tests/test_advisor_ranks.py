"""The advisor on multi-rank runs: imbalance -> new ratios with the expected step time, exposed
communication -> bucket / overlap advice, and `advise --apply` of the ratios on a real hybrid run."""
import json

import numpy as np
import pytest

from opscope.profiler.advisor.analyses import analyze, from_frame
from opscope.profiler.advisor.engine import evaluate
from opscope.profiler.advisor.rules import load_rules
from opscope.profiler.ranks import Ranks
from opscope.profiler.store import RunStore

MS = 1_000_000


def _frame(rows):
    """rows: (rank, step, op, start ms, end ms) -> the columns analyses.load reads."""
    n = len(rows)
    return {"rank": np.array([r[0] for r in rows]), "step": np.array([r[1] for r in rows]),
            "seq": np.arange(n), "op": np.array([r[2] for r in rows], dtype=object),
            "node": np.array([r[2] for r in rows], dtype=object), "backend": np.array(["x"] * n, dtype=object),
            "start_ns": np.array([r[3] * MS for r in rows]), "end_ns": np.array([r[4] * MS for r in rows]),
            "input_dtypes": np.array([None] * n, dtype=object), "output_dtypes": np.array([None] * n, dtype=object),
            "bytes": np.zeros(n, dtype=np.int64), "flops": np.zeros(n, dtype=np.int64),
            "fallback": np.zeros(n, dtype=bool), "live_bytes": np.zeros(n, dtype=np.int64)}


def _advice(run, rows):
    a = analyze(from_frame(run, _frame(rows)))
    return a, {x.rule: x for x in evaluate(load_rules(), a)}


def test_ratios_follow_each_chips_speed_on_a_simulated_hybrid_run():
    # two sim chips at shares 0.5/0.5: rank 0 computes 10 ms, rank 1 30 ms; the all-reduce itself takes 5 ms
    rows = []
    for step in range(3):
        t = step * 100
        rows += [(0, step, "forward_backward", t, t + 10), (0, step, "all_reduce", t + 10, t + 35),
                 (1, step, "forward_backward", t, t + 30), (1, step, "all_reduce", t + 30, t + 35)]
    run = {"run_id": "r", "model": "demo:mlp", "backend": "hybrid:sim:a=0.5,sim:b=0.5", "engine": "dist",
           "config": {"backends": ["sim:a", "sim:b"], "dist": {"backends": ["sim:a", "sim:b"],
                                                                 "steps": [{"ratios": [0.5, 0.5]}]}}}
    a, advice = _advice(run, rows)
    r = a["ranks"]
    assert r["clock"] == "simulated" and r["slowest_rank"] == 1 and r["hybrid"]
    # speeds 0.5/10 ms and 0.5/30 ms -> shares 3:1; balanced work 1 / (50 + 16.7) per s = 15 ms
    assert r["new_ratios"] == [0.75, 0.25] and r["new_hybrid"] == "sim:a=0.75,sim:b=0.25"
    assert r["balanced_seconds"] == pytest.approx(0.015)
    # step = slowest compute + the collective itself = 35 ms; balanced: 15 + 5 = 20 ms
    assert r["step_seconds"] == pytest.approx(0.035) and r["expected_step_seconds"] == pytest.approx(0.020)
    reb = advice["rebalance-ranks"]
    assert reb.estimated_gain["seconds"] == pytest.approx(0.015)
    assert reb.apply == {"kind": "ratios", "hybrid": "sim:a=0.75,sim:b=0.25"}
    assert "sim:a=0.75,sim:b=0.25" in reb.message and "35.00 ms -> 20.00 ms" in reb.message
    # 5 ms of 35 ms of exposed collectives: under the 10% bar? no: 14% -> overlap advice
    assert r["exposed_communication_seconds"] == pytest.approx(0.005)
    assert "overlap-communication" in advice and "bucket_cap_mb" in advice["overlap-communication"].message


def test_on_a_measured_run_the_rank_the_others_wait_for_is_slow_even_when_it_computes_no_more():
    # rank 1 stalls 40 ms before its ops (a sleep, a slow data loader): rank 0 waits for it in the all-reduce
    rows = []
    for step in range(3):
        t = step * 100
        rows += [(0, step, "linear", t, t + 10), (0, step, "all_reduce", t + 10, t + 55),
                 (1, step, "linear", t + 40, t + 50), (1, step, "all_reduce", t + 50, t + 55)]
    run = {"run_id": "r", "model": "import:x", "backend": "torch.profiler", "engine": "import", "config": {}}
    a, advice = _advice(run, rows)
    r = a["ranks"]
    assert r["clock"] == "wall" and r["slowest_rank"] == 1 and not r["hybrid"]
    assert r["work_seconds"] == pytest.approx([0.010, 0.050]) and r["new_ratios"] == [0.833, 0.167]
    assert "rebalance-ranks" in advice and "per-rank batch sizes" in advice["rebalance-ranks"].message
    ranks = Ranks(_frame(rows))
    assert [x["slow_rank"] for x in ranks.slow_rank()] == [1, 1, 1]
    assert ranks.slow_rank()[0]["lag_s"] == pytest.approx(0.040)


def test_a_single_rank_run_gets_no_rank_advice():
    rows = [(0, 0, "linear", 0, 10), (0, 1, "linear", 20, 30)]
    a, advice = _advice({"run_id": "r", "model": "m", "backend": "x", "config": {}}, rows)
    assert a["ranks"]["world_size"] == 1
    assert not {"rebalance-ranks", "overlap-communication"} & set(advice)


def _chip(tmp_path, name, peak):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[backend]\nname = "{name}"\nimplementation = "sim"\n[hardware]\n'
                    f'peak_flops = {{ float32 = {peak} }}\nmemory_bandwidth = {peak}\nlaunch_overhead = 0.0\n')
    return str(path)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_apply_rebalance_retrains_with_the_new_ratios_and_measures_the_step(cli, tmp_path):
    fast, slow = _chip(tmp_path, "fastchip", 3e10), _chip(tmp_path, "slowchip", 1e9)
    r = cli("train", "demo:mlp", "--hybrid", f"{fast}=0.5,{slow}=0.5", "--steps", "3", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = json.loads(r.stdout.strip().splitlines()[-1])["run_id"]

    r = cli("advise", run_id, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ranks = doc["analyses"]["ranks"]
    assert ranks["slowest_rank"] == 1 and ranks["clock"] == "simulated"
    new = ranks["new_ratios"]
    assert new[0] > 0.5 > new[1] and ranks["expected_step_seconds"] < ranks["step_seconds"]
    reb = next(a for a in doc["advice"] if a["rule"] == "rebalance-ranks")
    assert reb["apply"] == {"kind": "ratios", "hybrid": f"{fast}={new[0]:g},{slow}={new[1]:g}"}

    r = cli("advise", run_id, "--apply", "rebalance-ranks", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    store = RunStore()
    child = store.get_run(res["run_id"])
    assert child["parent_run"] == run_id and child["config"]["dist"]["steps"][-1]["ratios"] == new
    assert res["ratios"] == {"before": [0.5, 0.5], "after": new}
    steps = res["step_seconds"]
    assert steps["before"] == pytest.approx(ranks["step_seconds"])
    assert steps["estimated"] == pytest.approx(ranks["expected_step_seconds"])
    # measured: the new run's own step, from the same analysis
    from opscope.profiler.advisor.analyses import load
    assert steps["measured"] == pytest.approx(analyze(load(res["run_id"], store))["ranks"]["step_seconds"])
    # the slow chip's simulated compute shrank with its share; the loss is the full batch's either way
    def compute(rid):
        return [x["compute_s"] for x in Ranks.of_run(store, rid).temporal_breakdown() if x["rank"] == 1]
    assert max(compute(res["run_id"])) < min(compute(run_id))
    assert res["error"]["max_abs"] < 1e-4


def test_apply_rebalance_on_an_imported_run_says_it_cannot_retrain(cli, tmp_path):
    from test_import_ranks import _folder, _trace
    fast, slow = _trace(0, 2), _trace(1, 2)
    slow["traceEvents"][0]["dur"] = 90          # rank 1 computes 90 us, rank 0 50 us ...
    slow["traceEvents"][1]["ts"] += 40
    fast["traceEvents"][1]["dur"] = 60          # ... and rank 0 waits for it in the all-reduce
    r = cli("trace", "import", _folder(tmp_path, {"a.json": fast, "b.json": slow}))
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    r = cli("advise", run_id, "--apply", "rebalance-ranks")
    assert r.returncode == 2 and "is not one" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
