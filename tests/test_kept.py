"""A finished run's numbers are computed once and kept (issue 38: a 1M-event run's Compare page took 19-69 s and the
Advisor's first visit 47 s, computing on every visit); a big run's are computed as it is stored."""
import json

import numpy as np
import pytest

from opscope.profiler import kept, stats
from opscope.profiler.advisor import ANALYSES_ARTIFACT
from opscope.profiler.compare import compare_runs
from opscope.profiler.store import RunStore


def _run(store, n=400, seed=0, finish=True):
    rng = np.random.default_rng(seed)
    rid = store.create_run(model="m", backend="torch:cpu", device="cpu")
    dur = rng.integers(1_000, 50_000, n)
    start = np.cumsum(dur + 100) - dur
    ops = np.array(["linear", "gelu", "add"], dtype=object)[rng.integers(0, 3, n)]
    store.add_event_columns(rid, {
        "step": np.arange(n) // 100, "seq": np.arange(n) % 100, "op": ops, "node": ops,
        "backend": np.full(n, "torch:cpu", dtype=object), "device": np.full(n, "cpu", dtype=object),
        "thread": np.ones(n, np.int64), "depth": np.zeros(n, np.int64), "start_ns": start, "end_ns": start + dur,
        "module": np.full(n, "layers.0", dtype=object), "source": np.full(n, "model.py:1", dtype=object),
        "input_shapes": np.full(n, "[[4,8]]", dtype=object), "input_dtypes": np.full(n, '["float32"]', dtype=object),
        "output_shapes": np.full(n, "[[4,8]]", dtype=object), "output_dtypes": np.full(n, '["float32"]', dtype=object),
        "bytes": rng.integers(1, 1 << 20, n), "flops": rng.integers(1, 1 << 20, n), "fallback": np.zeros(n, bool),
        "live_bytes": rng.integers(1, 1 << 20, n)})
    if finish:
        store.finish_run(rid, status="ok")
    return rid


def test_a_finished_runs_times_are_kept_and_read_back_equal(opscope_home):
    store = RunStore()
    rid = _run(store)
    run = store.get_run(rid)
    with store.connect(read_only=True) as con:
        fresh = stats.run_times(con, rid)
    assert kept.run_times(store, run) == fresh
    names = [n for _k, n, _b in store.artifacts(rid, kept.KIND)]
    assert len(names) == 1 and names[0].startswith("run_times|")
    # read back, not computed: a changed kept value is what comes back
    with store.connect() as con:
        con.execute("UPDATE artifacts SET data = ? WHERE run_id = ? AND kind = ?",
                    [json.dumps({**fresh, "busy_ns": 7}).encode(), rid, kept.KIND])
    assert kept.run_times(store, run)["busy_ns"] == 7
    with store.connect() as con:             # what is not JSON is computed again, not a traceback on every visit
        con.execute("UPDATE artifacts SET data = ? WHERE run_id = ? AND kind = ?", [b"{damaged", rid, kept.KIND])
    assert kept.run_times(store, run) == fresh


def test_a_running_run_is_computed_afresh_and_nothing_is_kept(opscope_home):
    store = RunStore()
    rid = _run(store, finish=False)
    kept.run_times(store, store.get_run(rid))
    assert store.artifacts(rid, kept.KIND) == []
    assert kept.when_stored(store, rid, force=True) is False


def test_when_stored_computes_what_the_pages_read_and_compare_agrees(opscope_home):
    store = RunStore()
    a, b = _run(store), _run(store, seed=1)
    before = compare_runs(store, a, b)
    assert kept.when_stored(store, a) is False          # small: left to the first visit
    assert store.artifacts(a, ANALYSES_ARTIFACT) == []
    assert kept.when_stored(store, a, force=True) and kept.when_stored(store, b, force=True)
    assert len(store.artifacts(a, ANALYSES_ARTIFACT)) == 1
    assert store.query("SELECT count(*) FROM op_stats_cache WHERE run_id = ?", [a])[0][0] > 0
    assert compare_runs(store, a, b) == before


@pytest.mark.multiprocess
def test_a_big_runs_analyses_are_kept_by_a_detached_child_so_the_command_does_not_wait(opscope_home):
    import time

    from opscope.profiler.advisor import ANALYSES_ARTIFACT
    store = RunStore()
    rid = _run(store, 400)
    assert kept.when_stored(store, rid, force=True, analyses="background")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(store.artifacts(rid, kind=ANALYSES_ARTIFACT)):
        time.sleep(0.5)
    assert list(store.artifacts(rid, kind=ANALYSES_ARTIFACT)), "the detached child kept no analyses"


def test_deleting_a_run_removes_its_kept_files_and_no_other_runs(opscope_home):
    store = RunStore()
    a, b = _run(store), _run(store, seed=1)
    for rid in (a, b):
        assert kept.kept_bytes(store, store.get_run(rid), "spans", lambda: b"x" * 1000) == b"x" * 1000
    files = sorted(p.relative_to(opscope_home) for p in (opscope_home / "kept").rglob("*.bin"))
    assert len(files) == 2
    store.delete_run(a)
    left = sorted(p.relative_to(opscope_home) for p in (opscope_home / "kept").rglob("*.bin"))
    assert len(left) == 1 and b in str(left[0]).replace("-", "")


def test_a_kept_spans_file_that_does_not_read_back_is_built_again(opscope_home, monkeypatch):
    from opscope.app.web.data import WebData
    monkeypatch.setattr(kept, "BIG", 1)          # the timeline keeps a big run's spans: this one counts as big
    store = RunStore()
    rid = _run(store)
    first = WebData(store).spans(store.get_run(rid))
    (path,) = (opscope_home / "kept").rglob("*.bin")
    for damaged in (b"garbage", path.read_bytes()[:1000]):
        path.write_bytes(damaged)
        again = WebData(store).spans(store.get_run(rid))
        assert again.count == first.count and (again.start == first.start).all()
        assert path.read_bytes() != damaged                     # and kept anew


def test_forgetting_an_id_of_no_letters_removes_no_other_runs_files_whatever_the_stores_folder_is_called(tmp_path):
    store = RunStore(tmp_path / "kept" / "runs.duckdb")      # a store folder that happens to be named "kept"
    rid = _run(store)
    kept.kept_bytes(store, store.get_run(rid), "spans", lambda: b"x")
    kept.forget(store, "--")
    assert len(list((tmp_path / "kept" / "kept").rglob("*.bin"))) == 1
