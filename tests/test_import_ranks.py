"""`opscope trace import DIR`: one torch.profiler trace per rank (made here by 2 gloo processes) -> one
multi-rank run that profiler/ranks.py reads like a profiled one; folders of mixed runs are refused."""
import json
import shutil
import sys
import subprocess
import textwrap

import pytest

from opscope.profiler.ranks import Ranks, is_communication
from opscope.profiler.store import RunStore

# Two gloo ranks train a small DDP model under torch.profiler with a schedule; SLOW_RANK sleeps 150 ms in each
# step (on a loaded host a step of this tiny model under the profiler takes ~300 ms: 50 ms was within its jitter).
_TRAIN = textwrap.dedent('''
    import os, sys, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, out, slow = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(4):
            if rank == slow:
                time.sleep(0.15)
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            prof.step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.pt.trace.json"))
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def rank_traces(tmp_path_factory):
    """A folder with rank0.pt.trace.json and rank1.pt.trace.json; rank 1 is the slow one."""
    out = tmp_path_factory.mktemp("traces")
    script = out.parent / "train_ddp.py"
    script.write_text(_TRAIN)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(out), "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        log = p.communicate(timeout=240)[0]
        assert p.returncode == 0, log[-2000:]
    (out / "store").unlink(missing_ok=True)
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_per_rank_traces_import_as_one_run_and_the_sleeping_rank_is_named(cli, rank_traces):
    r = cli("trace", "import", rank_traces, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    store = RunStore()
    run = store.get_run(doc["run_id"])
    assert run["config"]["world_size"] == 2 and run["config"]["clock"] == "baseTimeNanoseconds"
    ev = store.events_frame(doc["run_id"], columns=["rank", "world_size", "step", "op", "node", "start_ns", "end_ns"])
    assert set(ev["rank"].tolist()) == {0, 1} and set(ev["world_size"].tolist()) == {2}
    # the gloo backend's all_reduce spans (the collective itself, waiting included) are op events of each rank
    spans = {}
    for rank, step, op, node, s, e in zip(*(ev[c].tolist() for c in ("rank", "step", "op", "node", "start_ns",
                                                                       "end_ns"))):
        if op == "all_reduce":
            assert node == "gloo:all_reduce" and is_communication(op)
            spans.setdefault((rank, step), []).append((s, e))
    assert {k for k in spans} == {(r, s) for r in (0, 1) for s in (0, 1, 2)}
    # clocks aligned: the same collective is in flight on both ranks at once
    for step in (0, 1, 2):
        (s0, e0), (s1, e1) = spans[(0, step)][-1], spans[(1, step)][-1]
        assert max(s0, s1) < min(e0, e1), (step, spans)

    ranks = Ranks.of_run(store, doc["run_id"])
    rows = ranks.temporal_breakdown()
    assert {(x["rank"], x["step"]) for x in rows} == {(r, s) for r in (0, 1) for s in (0, 1, 2)}
    assert all(x["compute_s"] > 0 and x["communication_s"] > 0 and x["idle_s"] >= 0 for x in rows)
    summary = ranks.summary()
    assert summary["world_size"] == 2 and summary["slowest_rank"] == 1
    # per step the slow rank is whichever the others waited for in that step: on a loaded host one step's
    # jitter can outlast the sleep and name rank 0 there; the rank named slowest is the one the others
    # waited for longest in all (profiler/ranks.py summary), and that is the sleeping rank
    per_step = ranks.slow_rank()
    assert [x["step"] for x in per_step] == [0, 1, 2] and all(x["lag_s"] >= 0 for x in per_step)
    assert 1 in [x["slow_rank"] for x in per_step]
    waited = {x["rank"]: x["others_waited_s"] for x in summary["ranks"]}
    assert waited[1] > waited[0], per_step
    # rank 0 waits in the collective for the sleep of rank 1
    r0, r1 = summary["ranks"]
    assert r0["communication_s"] > r1["communication_s"]

    # the advisor reads the same run: rank 1 holds the others back, so it gets the smaller share
    r = cli("advise", doc["run_id"], "--json")
    assert r.returncode == 0, r.stderr
    adv = json.loads(r.stdout)
    assert adv["analyses"]["ranks"]["slowest_rank"] == 1
    reb = next(a for a in adv["advice"] if a["rule"] == "rebalance-ranks")
    assert reb["evidence"]["new_ratios"][1] < 0.5 < reb["evidence"]["new_ratios"][0]


# --- folders of mixed runs: made from small hand-written traces ----------------------------------------
def _trace(rank, world, base=1_700_000_000_000_000_000, step_ts=1000.0):
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": step_ts + 10, "dur": 50},
           {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": step_ts + 70,
            "dur": 20},
           {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": step_ts,
            "dur": 100}]
    doc = {"schemaVersion": 1, "traceEvents": ops,
           "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    return doc


def _folder(tmp_path, docs: dict):
    d = tmp_path / "traces"
    d.mkdir()
    for name, doc in docs.items():
        (d / name).write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("docs, says", [
    ({"a.json": _trace(0, 2), "b.json": _trace(1, 4)}, "mixes runs: a.json has world_size 2, b.json has world_size 4"),
    ({"a.json": _trace(0, 2), "b.json": _trace(0, 2)}, "mixes runs: rank 0 is in both a.json and b.json"),
    ({"a.json": _trace(0, 2), "b.json": {"traceEvents": []}}, "b.json has no distributedInfo"),
    ({}, "no trace files"),
])
def test_a_folder_of_mixed_runs_is_refused_in_one_line(cli, tmp_path, docs, says):
    r = cli("trace", "import", _folder(tmp_path, docs))
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert RunStore().list_runs() == []


def test_clocks_align_on_base_time_or_on_the_first_step(tmp_path):
    from opscope.profiler.importers import import_trace
    store = RunStore()
    ms = 1_000_000

    def starts(run_id):
        ev = store.events_frame(run_id, columns=["rank", "node", "start_ns"])
        return {(r, n): s for r, n, s in zip(ev["rank"].tolist(), ev["node"].tolist(), ev["start_ns"].tolist())}

    # rank 1's clock origin is 3 ms later; its microseconds are 3 ms fewer for the same moment
    d = _folder(tmp_path, {"r0.json": _trace(0, 2, base=10 * ms, step_ts=5000.0),
                           "r1.json": _trace(1, 2, base=13 * ms, step_ts=2000.0)})
    s = starts(import_trace(d, store=store))
    assert s[(0, "aten::mm")] == s[(1, "aten::mm")] and s[(0, "gloo:all_reduce")] == s[(1, "gloo:all_reduce")]
    shutil.rmtree(d)
    # no base time: the first ProfilerStep of every rank starts together
    d = _folder(tmp_path, {"r0.json": _trace(0, 2, base=None, step_ts=5000.0),
                           "r1.json": _trace(1, 2, base=None, step_ts=2500.0)})
    rid = import_trace(d, store=store)
    assert store.get_run(rid)["config"]["clock"] == "first ProfilerStep"
    s = starts(rid)
    assert s[(0, "aten::mm")] == s[(1, "aten::mm")]


def test_a_single_rank_trace_keeps_its_rank(tmp_path):
    from opscope.profiler.importers import import_trace
    f = tmp_path / "rank3.json"
    f.write_text(json.dumps(_trace(3, 4)))
    store = RunStore()
    ev = store.events_frame(import_trace(f, store=store), columns=["rank", "world_size", "op"])
    assert set(ev["rank"].tolist()) == {3} and set(ev["world_size"].tolist()) == {4}
    assert "all_reduce" in ev["op"].tolist()
