"""`opscope profile MODEL --capture dynamo`: every torch.compile region's ops, one step per model call."""
import json
from collections import Counter

import pytest
import torch

from opscope.profiler import RunStore, profile
from opscope.runtime import dynamo
from opscope.runtime.errors import UsageError
from test_dynamo import Breaky, LoopMoE, _seeded


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class RegionOps:
    """Counts the ops every region run is about to execute, and keeps each run's plan."""

    def __init__(self):
        self.ops, self.plans = 0, []

    def on_run_start(self, info):
        self.ops += len(info.plan.steps)
        self.plans.append(info.plan)


def _events(rid):
    return RunStore().query("SELECT step, seq, node, module, phase, fwd_node FROM events WHERE run_id = ? "
                            "ORDER BY step, seq", [rid])


def _check_steps(rid, steps, per_step, unique=True):
    rows = _events(rid)
    by_step = Counter(r[0] for r in rows)
    assert by_step == {s: per_step for s in range(steps)}
    for s in range(steps):
        seqs = [r[1] for r in rows if r[0] == s]
        assert seqs == list(range(per_step))                # seq counts on across the step's regions
        nodes = [(r[2], r[3]) for r in rows if r[0] == s]
        # two regions' `addmm` stay apart (a region that runs for several experts differs in module path)
        assert not unique or len(set(nodes)) == len(nodes)
    return rows


def test_profile_capture_dynamo_records_every_region_op():
    m, x = _seeded(Breaky), torch.randn(3, 8)
    count = RegionOps()
    with dynamo.hooked(count):
        rid = profile("breaky", "numpy", model=m, inputs=(x,), steps=3, warmup=1, capture="dynamo")
    plans = list({id(p): p for p in count.plans}.values())
    assert len(plans) == 3                                   # .item() and print(): three regions
    per_step = sum(len(p.steps) for p in plans)
    rows = _check_steps(rid, 3, per_step)
    # every plan node shows up once per step, named by its region
    want = Counter()
    for p in plans:
        prefix = "region" + p.graph.model_name.split(" region ")[1].split()[0] + "/"
        want.update(prefix + st.node.name for st in p.steps)
    assert Counter(r[2] for r in rows if r[0] == 0) == want
    assert {"a", "norm", "b"} <= {r[3] for r in rows}
    run = RunStore().get_run(rid)
    assert run["status"] == "ok" and run["events"] == 3 * per_step
    cap = run["config"]["capture"]
    assert cap["kind"] == "dynamo" and cap["regions"] == 3 and cap["graph_breaks"] == 2
    assert any("item()" in r for r in cap["break_reasons"])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_profile_capture_dynamo_data_dependent_moe():
    m, x = _seeded(LoopMoE), torch.randn(12, 16)
    count = RegionOps()
    steps = 2
    with dynamo.hooked(count):      # the compile call, then `steps` recorded calls of the same routing
        rid = profile("moe", "sim:npu-a1", model=m, inputs=(x,), steps=steps, capture="dynamo")
    assert count.ops % (steps + 1) == 0
    per_step = count.ops // (steps + 1)
    rows = _check_steps(rid, steps, per_step, unique=False)   # one expert region runs for every expert hit
    hit = {f"experts.{int(e)}.up" for e in m.gate(x).argmax(-1).unique()}
    assert {"gate"} | hit <= {r[3] for r in rows}
    regions = {r[2].split("/")[0] for r in rows}
    # the router's region and the expert region (compiled again with symbolic shapes) both run each step
    assert len(regions) >= 2 and RunStore().get_run(rid)["config"]["capture"]["regions"] > 2


def test_profile_capture_dynamo_training_regions_link_backward_to_forward():
    """A compiled region under autograd: node names of both graphs carry the region, and a backward node's
    forward node is named the way the forward graph's events are."""
    from opscope.profiler.batch import StoreSink
    from opscope.profiler.recorder import Recorder

    m = _seeded(Breaky).train()
    x = torch.randn(3, 8)
    dm = dynamo.compile(m, "numpy")
    store = RunStore()
    rid = store.create_run(model="breaky", backend="numpy", device="cpu", engine="graph", description={},
                           steps=2, warmup=0, config={})
    rec = Recorder(StoreSink(store, rid), regions=True)
    with dm.hooked(rec):
        for _ in range(2):
            dm(x).pow(2).sum().backward()
            rec.end_step()
    rows = _events(rid)
    fwd_nodes = {r[2] for r in rows if r[4] == "forward"}
    back = [r for r in rows if r[4] == "backward"]
    assert back and all(".backward/" in r[2] for r in back)
    linked = [r for r in back if r[5]]
    assert linked and all(r[5] in fwd_nodes and ".forward/" in r[5] for r in linked)
    assert Counter(r[0] for r in rows)[0] == Counter(r[0] for r in rows)[1]


from test_dynamo import MODEL_FILE  # noqa: E402 -- the same graph-breaking model the backend tests use


@pytest.mark.multiprocess
def test_cli_profile_capture_dynamo_through_the_runner(cli, tmp_path):
    f = tmp_path / "net.py"
    f.write_text(MODEL_FILE)
    r = cli("profile", f"{f}:factory", "-b", "numpy", "--capture", "dynamo", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok" and doc["steps"] == 2
    assert doc["capture"]["regions"] >= 2 and doc["capture"]["graph_breaks"] >= 1
    run = RunStore().get_run(doc["run_id"])
    nodes = run["config"]["nodes"]
    rows = _check_steps(doc["run_id"], 2, nodes)       # the same input: every compiled region runs each step
    assert len({r[2].split("/")[0] for r in rows}) >= 2 and "lin" in {r[3] for r in rows}
    text = cli("profile", f"{f}:factory", "-b", "numpy", "--capture", "dynamo")
    assert text.returncode == 0 and "graph breaks" in text.stdout


@pytest.mark.parametrize("extra", [["--train"], ["--engine", "eager"]])
def test_cli_profile_capture_dynamo_bad_combination_is_one_line(cli, extra):
    r = cli("profile", "demo:mlp", "--capture", "dynamo", *extra)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--capture dynamo" in r.stderr
    assert RunStore().list_runs() == []


def test_in_process_bad_capture_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown capture"):
        profile("x", "numpy", model=torch.nn.Linear(2, 2), inputs=(torch.ones(1, 2),), capture="trace")
