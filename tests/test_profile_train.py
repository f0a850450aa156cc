"""`opscope profile MODEL --train`: every op of every training step, with its phase and forward link."""
import json
from collections import Counter

import pytest

from opscope.profiler import RunStore, profile
from opscope.profiler.export import export
from opscope.profiler.export.chrome import load_chrome
from opscope.runtime import backends, models
from opscope.runtime.train import OptimizerSpec, Trainer, phase_of
from opscope.runtime.train.memory import CATEGORIES, memory_timeline


def _phase_counts(spec, optimizer="sgd"):
    model, inputs = models.load_train(spec)
    t = Trainer.create(model, inputs, backends.resolve("numpy"), OptimizerSpec(optimizer))
    return Counter(phase_of(n) for n in t.train.graph.nodes), t


def _check_run(store, rid, spec, steps, optimizer="sgd"):
    want, _ = _phase_counts(spec, optimizer)
    rows = store.query("SELECT step, phase, count(*) FROM events WHERE run_id = ? GROUP BY step, phase", [rid])
    got = {(s, p): n for s, p, n in rows}
    for s in range(steps):           # every step records every node of the graph, by phase
        for phase in ("forward", "backward", "optimizer"):
            assert got.get((s, phase)) == want[phase], (s, phase, got, want)
    # every backward event names a forward node of the same run (and none is left without one)
    forward = {n for (n,) in store.query("SELECT DISTINCT node FROM events WHERE run_id = ? AND phase = 'forward'",
                                         [rid])}
    links = store.query("SELECT node, fwd_node FROM events WHERE run_id = ? AND phase = 'backward'", [rid])
    linked = [f for _, f in links if f]
    assert linked and all(f in forward for f in linked), set(linked) - forward
    assert len(linked) >= 0.9 * len(links)       # the ones without are the loss's own seed (ones_like, ...)
    assert store.query("SELECT count(*) FROM events WHERE run_id = ? AND phase <> 'backward' AND fwd_node <> ''",
                       [rid])[0][0] == 0


@pytest.mark.multiprocess
def test_profile_train_mlp_records_phases_links_and_memory_categories(cli):
    r = cli("profile", "demo:mlp", "--train", "--steps", "2", "--optimizer", "adamw", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["phases"]) == {"forward", "backward", "optimizer"}
    store = RunStore()
    _check_run(store, doc["run_id"], "demo:mlp", 2, "adamw")
    cfg = store.get_run(doc["run_id"])["config"]
    train = cfg["train"]
    assert train["optimizer"] == "adamw" and len(train["losses"]) == 2
    tl = train["memory_timeline"]
    assert set(CATEGORIES) <= set(tl) and len(tl["seq"]) == len(tl["parameter"]) > 1
    assert tl["peak"]["owner"] in CATEGORIES and tl["peak"]["bytes"] > 0
    assert max(tl["gradient"]) > 0 and max(tl["activation"]) > 0 and tl["optimizer_state"][0] > 0


def test_memory_timeline_adds_up_to_the_executors_live_bytes():
    _, t = _phase_counts("demo:mlp")
    tl = memory_timeline(t)
    resident = tl["parameter"][0] + tl["optimizer_state"][0] + tl["input"][0]
    # what the step allocates (gradient + activation + temporary + new parameters/state) peaks at the plan's peak
    step_peak = max(sum(tl[c][i] for c in CATEGORIES) for i in range(len(tl["seq"]))) - resident
    # inputs are the caller's: neither side counts them in or out (the executor once subtracted an input
    # after its last reader without ever adding it, and its peak came out low)
    assert step_peak == t.plan.peak_bytes
    assert tl["gradient"][-1] == 0 or tl["gradient"][-1] <= t.memory()["gradients"]
    assert max(tl["activation"]) == t.memory()["activations"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_profile_train_gpt_two_steps_every_node_with_phase_and_forward_link(cli, tmp_path):
    r = cli("profile", "demo:gpt", "--train", "--steps", "2", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    store = RunStore()
    _check_run(store, rid, "demo:gpt", 2)
    out = tmp_path / "gpt-train.json"
    export(store, rid, "chrome", out)
    cats = Counter(e.get("cat") for e in load_chrome(out)["traceEvents"] if e.get("ph") == "X")
    assert {"forward", "backward", "optimizer"} <= set(cats)
    bw = next(e for e in load_chrome(out)["traceEvents"] if e.get("cat") == "backward" and e["args"].get("fwd_node"))
    assert bw["args"]["phase"] == "backward"


def test_profile_train_in_process_keeps_phases_and_losses():
    model, inputs = models.load_train("demo:mlp")
    rid = profile("demo:mlp", "numpy", steps=2, model=model, inputs=inputs, train={"optimizer": "sgd", "lr": 0.05})
    store = RunStore()
    _check_run(store, rid, "demo:mlp", 2)
    train = store.get_run(rid)["config"]["train"]
    assert train["lr"] == 0.05 and train["losses"][1] < train["losses"][0]


def test_profile_train_bad_input_is_one_line_exit_2(cli):
    r = cli("profile", "demo:mlp", "--train", "--optimizer", "lion")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "lion" in r.stderr
    r = cli("profile", "demo:mlp", "--train", "--engine", "eager")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "-- python" in r.stderr
    r = cli("profile", "demo:mlp", "--train", "--lr", "-1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("irregular", [False, True], ids=["columns", "event-by-event"])
def test_an_exported_training_run_imports_back_with_its_phases_and_forward_links(tmp_path, irregular):
    """A training run exported to Chrome JSON came back all-forward: the importer dropped args.phase."""
    from opscope.profiler.importers import import_trace
    model, inputs = models.load_train("demo:mlp")
    rid = profile("demo:mlp", "numpy", steps=2, model=model, inputs=inputs, train={"optimizer": "sgd"})
    store = RunStore()
    out = tmp_path / "train.json"
    export(store, rid, "chrome", out)
    if irregular:        # one B/E pair sends the whole file down the event-by-event parser
        doc = load_chrome(out)
        doc["traceEvents"] += [{"ph": "B", "name": "mark", "cat": "user", "pid": 1, "tid": 99, "ts": 0},
                               {"ph": "E", "pid": 1, "tid": 99, "ts": 1}]
        out.write_text(json.dumps(doc))
    back = import_trace(out, store=store)
    q = "SELECT phase, node, fwd_node, count(*) FROM events WHERE run_id = ? AND op <> 'mark' GROUP BY ALL ORDER BY ALL"
    assert store.query(q, [back]) == store.query(q, [rid])
    assert {p for p, *_ in store.query(q, [back])} == {"forward", "backward", "optimizer"}
    # the live-memory counters come back as the memory the web app draws, peak and peak op included
    # (the event-by-event parser, which takes B/E pairs, counts them as dropped instead)
    from opscope.app.web.data import WebData
    data = WebData(store)
    series = {r: data.memory_series(r) for r in (rid, back)}
    peaks = {r: [(p["backend"], p["bytes"], p["op"], p["node"]) for p in data.memory_peaks(store.get_run(r))]
             for r in (rid, back)}
    if irregular:
        assert store.get_run(back)["config"]["import"]["kinds_dropped"]["ph:C"] > 0
    else:
        assert {b: v for b, (_, v) in series[back].items()} == {b: v for b, (_, v) in series[rid].items()}
        assert peaks[back] == peaks[rid] and peaks[rid][0][1] > 0
        acc = store.get_run(back)["config"]["import"]
        assert acc["stored_as"]["ph:C"] == ["memory"]
        # our own export loses nothing on the way back: its step spans are the ops' steps, its M events the
        # track names, so nothing is listed as dropped (it once listed both)
        assert acc["kinds_dropped"] == {} and acc["stored_as"]["ph:M"] == ["track names"]
        assert acc["stored_as"]["step"] == ["steps"]
