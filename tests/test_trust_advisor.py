"""The advisor's analyses of a finished run are kept in the store (issue 27: the Advisor page sat on "loading..."
for 38.5 s on a 1M-event import, recomputing them on every visit): computed once, read back equal, never kept
for a running run, and recomputed when the run's row changes."""
import json

from opscope.profiler.advisor import ANALYSES_ARTIFACT, analyses, report, run_analyses
from opscope.profiler.store import RunStore


def _run(store, status="ok"):
    rid = store.create_run(model="m", backend="sim:npu-a1", device="npu")
    rows = []
    for step in range(2):
        for seq, (op, dur) in enumerate((("linear", 4000), ("gelu", 1000), ("transfer", 500))):
            start = step * 100_000 + seq * 10_000
            rows.append({"step": step, "seq": seq, "op": op, "node": op, "module": "", "source": "",
                         "backend": "npu-a1", "device": "npu", "thread": 1, "depth": 0, "start_ns": start,
                         "end_ns": start + dur, "input_shapes": "[[64,64]]", "input_dtypes": '["float32"]',
                         "output_shapes": "[[64,64]]", "output_dtypes": '["float32"]', "bytes": 1 << 20,
                         "flops": 1 << 24, "fallback": op == "gelu", "live_bytes": 1 << 20})
    store.add_event_columns(rid, {k: [r[k] for r in rows] for k in rows[0]})
    if status != "running":
        store.finish_run(rid, status=status)
    return rid


def test_a_finished_runs_analyses_are_computed_once_then_read(opscope_home):
    store = RunStore()
    rid = _run(store)
    fresh = analyses.analyze(analyses.load(rid, store))
    assert run_analyses(rid, store) == fresh
    kept = store.artifacts(rid, ANALYSES_ARTIFACT)
    assert len(kept) == 1 and json.loads(kept[0][2]) == fresh
    # the second ask reads what was kept (a marked copy proves it), and writes nothing more
    marked = {**fresh, "time": {**fresh["time"], "seconds": 123.0}}
    with store.connect() as con:
        con.execute("UPDATE artifacts SET data = ? WHERE run_id = ? AND kind = ?",
                    [json.dumps(marked).encode(), rid, ANALYSES_ARTIFACT])
    assert report(rid, store)[0]["time"]["seconds"] == 123.0
    assert len(store.artifacts(rid, ANALYSES_ARTIFACT)) == 1


def test_a_running_run_is_analysed_afresh_and_a_changed_row_recomputed(opscope_home):
    store = RunStore()
    rid = _run(store, status="running")
    run_analyses(rid, store)
    assert store.artifacts(rid, ANALYSES_ARTIFACT) == []          # its events are not final
    store.finish_run(rid, status="ok")
    first = run_analyses(rid, store)
    store.update_run(rid, config={"train": {"optimizer": "adamw"}})   # the row the analyses read changed
    again = run_analyses(rid, store)
    assert again["train"]["optimizer"] == "adamw" and first["train"]["optimizer"] == ""
    assert len(store.artifacts(rid, ANALYSES_ARTIFACT)) == 2


class _CountsStepReads(dict):
    """An event that counts how often an analysis reads its step."""
    reads = 0

    def __getitem__(self, key):
        if key == "step":
            _CountsStepReads.reads += 1
        return super().__getitem__(key)


def test_the_analyses_read_each_event_a_few_times_not_once_per_step(opscope_home):
    """Per-step filters over every event (wall time, gaps, device busy) were steps x events: 40k events of 2,000
    steps took 384 s to analyse, 4 s since; a run of thousands of steps and 1M events, hours."""
    store = RunStore()
    data = analyses.load(_run(store), store)
    steps = 300
    events = [_CountsStepReads({**e, "step": s, "start": e["start"] + s * 10**9, "end": e["end"] + s * 10**9})
              for s in range(steps) for e in data.events]
    _CountsStepReads.reads = 0
    a = analyses.analyze(analyses.RunData(data.run, events, data.description, steps))
    assert a["run"]["steps"] == steps and a["gaps"]["count"] >= 1
    assert _CountsStepReads.reads < 20 * len(events), _CountsStepReads.reads / len(events)
