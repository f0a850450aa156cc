"""Runs beyond one machine (issue 18.6): every rank writes its events to a shared folder as Parquet
(profiler/shared.py); `opscope trace import DIR` and `opscope serve DIR` read them in place."""
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import duckdb
import pytest

from conftest import ctrl_c_able
from opscope.profiler.ranks import Ranks
from opscope.profiler.shared import RankWriter, import_shared, job_name
from opscope.profiler.store import RunStore
from opscope.profiler.hybrid_rank import span_events
from opscope.runtime.dist.job import DistJob
from opscope.runtime.errors import UsageError

HYBRID = "torch:cpu=0.5,sim:npu-a1=0.5"
SPANS = ["forward_backward", "all_reduce", "optimizer", "all_gather"]


def _layout(job: Path, world: int, steps: int) -> None:
    assert json.loads((job / "run.json").read_text())["world_size"] == world
    for r in range(world):
        assert json.loads((job / f"rank-{r}.json").read_text())["status"] == "ok"
        assert sorted(p.name for p in (job / f"rank-{r}").iterdir()) == [f"step-{n}.parquet" for n in range(steps)]


def _import(cli, folder) -> dict:
    r = cli("trace", "import", folder, "--json", timeout=200)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def _check_events_match_report(store, rid, report, world):
    """Every rank's four spans per step, and the compute span lasting what the report says that rank's
    device took (the trainer makes it exactly that long)."""
    ev = store.events_frame(rid, columns=["rank", "world_size", "step", "op", "start_ns", "end_ns", "phase"])
    rows = list(zip(*(ev[c].tolist() for c in ("rank", "step", "op", "start_ns", "end_ns"))))
    assert set(ev["world_size"].tolist()) == {world}
    for s in report["steps"]:
        for r in range(world):
            mine = [x for x in rows if x[0] == r and x[1] == s["step"]]
            assert [x[2] for x in mine] == SPANS, (r, s["step"], mine)
            fb = mine[0]
            assert fb[4] - fb[3] == int(s["device_seconds"][r] * 1e9)
    assert len(rows) == world * len(SPANS) * len(report["steps"])


# --- (a) torchrun: every rank writes from inside itself -------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_torchrun_job_writes_every_rank_and_imports_as_one_run(cli, tmp_path):
    shared = tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "opscope.app.hybrid", "demo:mlp", "--hybrid", HYBRID, "--steps", "3", "--json",
                        "--shared-dir", str(shared)], capture_output=True, text=True, timeout=280, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    report = next(json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))
    job = Path(report["shared"])
    assert job.parent == shared and len(list(shared.iterdir())) == 1
    _layout(job, 2, 3)
    assert json.loads((job / "run.json").read_text())["report"]["losses"] == report["losses"]

    doc = _import(cli, shared)
    assert doc["run_ids"] == [doc["run_id"]] and doc["world_size"] == 2 and doc["status"] == "ok"
    assert doc["events"] == 2 * 4 * 3 and doc["format"] == "opscope-shared"
    store = RunStore()
    run = store.get_run(doc["run_id"])
    assert run["engine"] == "dist" and run["backend"] == f"hybrid:{HYBRID}"
    assert run["config"]["dist"]["losses"] == report["losses"]
    _check_events_match_report(store, doc["run_id"], report, 2)
    ranks = Ranks.of_run(store, doc["run_id"])
    assert [r["rank"] for r in ranks.summary()["ranks"]] == [0, 1]
    assert {(b["rank"], b["step"]) for b in ranks.temporal_breakdown()} == {(r, s) for r in (0, 1) for s in range(3)}


# --- (b) opscope's own launcher: the same layout, the same events as the local store ------------------
@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_launcher_writes_the_same_layout_and_events_as_its_local_run(cli, tmp_path):
    shared = tmp_path / "shared"
    r = cli("train", "demo:mlp", "--hybrid", HYBRID, "--steps", "3", "--json", "--shared-dir", shared, timeout=280)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    _layout(Path(report["shared"]), 2, 3)
    doc = _import(cli, shared)
    store = RunStore()
    cols = ["rank", "step", "op", "start_ns", "end_ns", "phase", "backend"]
    local = store.events_frame(report["run_id"], columns=cols)
    imported = store.events_frame(doc["run_id"], columns=cols)
    assert {c: local[c].tolist() for c in cols} == {c: imported[c].tolist() for c in cols}
    _check_events_match_report(store, doc["run_id"], report, 2)


def test_the_shared_folder_comes_from_the_environment_and_must_be_writable(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = cli("train", "demo:mlp", "--hybrid", HYBRID, "--shared-dir", blocker / "under", timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--shared-dir" in r.stderr, r.stderr
    r = cli("train", "demo:mlp", "--hybrid", HYBRID, env={"OPSCOPE_SHARED_DIR": str(blocker)}, timeout=120)
    assert r.returncode == 2 and "not a folder" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_job_travels_with_its_shared_folder():
    job = DistJob.parse("demo:mlp", HYBRID, steps=2, shared_dir="/mnt/shared")
    assert DistJob.from_json(job.to_json()).shared_dir == "/mnt/shared"


# --- (c) a rank that dies -----------------------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_rank_that_dies_keeps_its_steps_and_the_run_is_incomplete_naming_it(tmp_path):
    from opscope.runtime.dist.launch import launch
    job = DistJob.parse("demo:mlp", HYBRID, steps=200, timeout_s=30, shared_dir=str(tmp_path))

    def kill_rank_1(rec, procs):
        if rec.get("kind") == "step" and rec["rank"] == 1 and rec["step"] == 1:
            os.kill(procs[1].pid, signal.SIGKILL)

    result = launch(job, on_record=kill_rank_1, worker="opscope.profiler.hybrid_rank")   # the rank that writes DIR
    assert result.exit_codes[1] == -signal.SIGKILL and result.exit_codes[0] == 1
    folder = Path(result.of("start", 0)[0]["shared"])
    assert json.loads((folder / "rank-1.json").read_text())["status"] == "running"      # it never said goodbye
    rank0 = json.loads((folder / "rank-0.json").read_text())
    assert rank0["status"] == "failed" and "all-reduce of the gradients failed" in rank0["error"]
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"
    written = {int(p.stem.split("-")[1]) for p in (folder / "rank-1").glob("step-*.parquet")}
    assert {0, 1} <= written <= {0, 1, 2}

    store = RunStore()
    [rid] = import_shared(tmp_path, store)
    run = store.get_run(rid)
    assert run["status"] == "incomplete"
    assert run["error"].startswith("rank 1 (sim:npu-a1) never finished") and "rank 0 (torch:cpu) failed" in run["error"]
    ev = store.events_frame(rid, columns=["rank", "step"])
    kept = set(zip(ev["rank"].tolist(), ev["step"].tolist()))
    assert {(0, 0), (0, 1), (1, 0), (1, 1)} <= kept and {(1, n) for n in written} <= kept


def test_the_runtime_rank_refuses_a_shared_folder_it_cannot_write(tmp_path):
    """runtime/dist imports none of the tools: its own rank has no --shared-dir writer, so a job that asks for one
    is refused in one line before any process starts, rather than run without writing the folder."""
    from opscope.runtime.dist.launch import launch
    shared = tmp_path / "shared"
    shared.mkdir()
    job = DistJob.parse("demo:mlp", HYBRID, steps=1, shared_dir=str(shared))
    with pytest.raises(UsageError, match="hybrid_rank"):
        launch(job)
    assert list(shared.iterdir()) == []


# --- a job written without processes: the hostile folders start from it --------------------------------
def _fake_job(root: Path, steps: int = 2, world: int = 2, model: str = "demo:mlp") -> Path:
    base = 123456789 + len(list(root.glob("*"))) if root.exists() else 123456789
    for r in range(world):
        w = RankWriter(root, job_name(model, base), r)
        run = {"model": model, "hybrid": HYBRID, "backends": ["torch:cpu", "sim:npu-a1"], "world_size": world,
               "steps": steps} if r == 0 else None
        w.begin(run, {"backend": ["torch:cpu", "sim:npu-a1"][r]})
        for n in range(steps):
            t = base + n * 1000
            spans = [[name, t + i * 100, t + i * 100 + 90] for i, name in enumerate(SPANS)]
            w.step(n, span_events({"step": n, "rank": r, "world_size": world, "backend": "torch:cpu",
                                   "spans": spans}))
        w.end("ok", None, report={"steps": [], "status": "ok"} if r == 0 else None)
    return w.folder


def test_a_written_job_imports_in_place_and_several_jobs_are_several_runs(tmp_path):
    _fake_job(tmp_path / "shared")
    _fake_job(tmp_path / "shared", steps=3)
    store = RunStore()
    ids = import_shared(tmp_path / "shared", store)
    assert len(ids) == 2
    assert sorted(store.get_run(i)["events"] for i in ids) == [2 * 4 * 2, 2 * 4 * 3]
    assert all(store.get_run(i)["status"] == "ok" for i in ids)


def _copy_parquet(src: Path, dst: Path, select: str) -> None:
    con = duckdb.connect(":memory:")
    con.execute(f"COPY (SELECT {select} FROM read_parquet(?)) TO '{dst}.tmp' (FORMAT parquet)", [str(src)])
    con.close()
    os.replace(f"{dst}.tmp", dst)


def _corrupt(job: Path):
    (job / "rank-1" / "step-1.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 50)
    return "rank-1/step-1.parquet", "not a readable Parquet file"


def _missing_column(job: Path):
    f = job / "rank-0" / "step-0.parquet"
    _copy_parquet(f, f, "* EXCLUDE (op)")
    return "rank-0/step-0.parquet", "lacks column(s) op"


def _mistyped_column(job: Path):
    f = job / "rank-1" / "step-0.parquet"
    _copy_parquet(f, f, "* REPLACE (CAST(start_ns AS VARCHAR) AS start_ns)")
    return "rank-1/step-0.parquet", "column start_ns is BYTE_ARRAY"


def _run_json_list(job: Path):
    (job / "run.json").write_text("[1, 2]")
    return "run.json", "expected a JSON object, got list"


def _run_json_huge(job: Path):
    (job / "run.json").write_text('{"model": "' + "x" * (5 * 1024 ** 2) + '"}')
    return "run.json", "more than opscope ever reads there"


@pytest.mark.parametrize("spoil", [_corrupt, _missing_column, _mistyped_column, _run_json_list, _run_json_huge])
def test_a_hostile_shared_folder_is_one_line_exit_2_and_the_store_is_unchanged(cli, tmp_path, spoil):
    _fake_job(tmp_path / "shared")                     # a good job beside the bad one is not imported either
    where, why = spoil(_fake_job(tmp_path / "shared"))
    r = cli("trace", "import", tmp_path / "shared", timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert where in r.stderr and why in r.stderr, r.stderr
    assert RunStore().list_runs() == []


@pytest.mark.multiprocess
def test_a_shared_folder_that_is_empty_or_a_file_is_refused_in_one_line(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    a_file = tmp_path / "file.parquet"
    a_file.write_bytes(b"PAR1")
    with pytest.raises(UsageError, match="no job in it"):
        import_shared(tmp_path / "empty")
    with pytest.raises(UsageError, match="a file, not a shared run folder"):
        import_shared(a_file)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for target, why in ((tmp_path / "empty", "no job in it"), (a_file, "a file, not a shared run folder")):
        r = cli("serve", target, "--port", "0", env={"TMPDIR": str(tmp)}, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and why in r.stderr, r.stderr
    assert list(tmp.iterdir()) == []                   # the private store went away with the refusal
    assert RunStore().list_runs() == []


# --- (e) `opscope serve FOLDER` -------------------------------------------------------------------------
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs_over_http(port: int) -> list[dict]:
    """The runs page's table, asked the way the page asks (a Dash callback), over a real socket."""
    body = {"output": "runs-table.rowData", "outputs": {"id": "runs-table", "property": "rowData"},
            "inputs": [{"id": "run-status", "property": "data", "value": None}],
            "changedPropIds": ["run-status.data"], "state": []}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/_dash-update-component", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["response"]["runs-table"]["rowData"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_serve_a_shared_folder_shows_its_jobs_from_a_private_store_that_goes_away(tmp_path, opscope_home):
    job = _fake_job(tmp_path / "shared", steps=3)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "serve", str(tmp_path / "shared"), "--port",
                             str(port), "--no-token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_able, env=dict(env, TMPDIR=str(tmp)))
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[0].startswith(f"serving 1 run(s) from {tmp_path / 'shared'}"), (lines, proc.stderr.read()
                                                                                      if proc.poll() else "")
        rid = lines[1].split()[0]
        assert "2 ranks" in lines[1] and "ok" in lines[1]
        assert f"http://127.0.0.1:{port}/" in lines[2]
        [private] = list(tmp.iterdir())
        assert (private / "runs.duckdb").exists()
        rows = _runs_over_http(port)
        assert [(r["run_id"], r["engine"], r["events"], r["status"]) for r in rows] == [(rid, "dist", 24, "ok")]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_opscope/live?run={rid}", timeout=60) as r:
            assert json.loads(r.read()) == {"run": rid, "status": "ok", "events": 24, "dropped": 0}
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert list(tmp.iterdir()) == []                   # the private store is gone
    assert RunStore().list_runs() == []                # and OPSCOPE_HOME never saw the runs
    assert job.exists()                                # the shared folder is read, never changed


def test_a_torch_profiler_folder_named_rank_dash_n_still_takes_the_trace_path(cli, tmp_path):
    """rank-0.json is how people name per-rank torch.profiler traces too: without run.json or rank-<r>/ it is not
    a shared folder."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank-0.json").write_text('{"traceEvents": []}')
    r = cli("trace", "import", tmp_path / "traces", timeout=120)
    assert r.returncode == 2 and "has no distributedInfo" in r.stderr, r.stderr
