"""The run store under storage faults and in hostile homes (issue 11): a read-only home, a full disk,
a home that is a file or cannot be created, a damaged database -- one line, never a traceback;
reading never writes; the store is private to its user.

The tests run as root, and root ignores permission bits: a chmod 0555 home would still be written.
A read-only home here is a real read-only file system (a tmpfs remounted read-only), and a full
disk a real small tmpfs; both need mount(2), and skip with the reason where it is not permitted.
"""
import json
import os
import random
import stat
import subprocess
import sys

import pytest

from opscope.profiler.store import RunStore, StoreError
from opscope.runtime.errors import UsageError

ROW = (0, 0, "relu", "relu", "", "", "numpy", "cpu", 1, 0, 1, 2, "[]", "[]", "[]", "[]", 0, 0, False, 0)


def _mount(*args):
    return subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size="1m") -> a fresh tmpfs folder of that size; unmounted at the end."""
    mounted = []

    def mount(size="64m"):
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        r = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", d)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root and mount(2)): {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _read_only(folder):
    r = _mount("-o", "remount,ro", folder)
    assert r.returncode == 0, r.stderr
    with pytest.raises(OSError):                     # really read-only, for root too
        (folder / "probe").write_text("x")


def _dead_running_run(home) -> str:
    """A run left 'running' by a collector that died (os._exit before finish_run)."""
    code = ("import os; from opscope.profiler.store import RunStore; s = RunStore(); "
            "rid = s.create_run(model='m', backend='numpy'); s.add_events(rid, [%r]); "
            "print(rid, flush=True); os._exit(0)") % (ROW,)
    env = dict(os.environ, OPSCOPE_HOME=str(home))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return out.stdout.split()[-1]


def _one_line(r, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error:"), r.stderr
    return lines[0]


# --- reading never writes ---------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_a_read_only_home_reads_and_shows_a_dead_run_as_failed_without_writing(tmpfs, cli):
    home = tmpfs()
    rid = _dead_running_run(home)
    _read_only(home)
    env = {"OPSCOPE_HOME": str(home)}
    r = cli("runs", "--json", env=env)
    assert r.returncode == 0, r.stderr
    run = {x["run_id"]: x for x in json.loads(r.stdout)["runs"]}[rid]
    assert run["status"] == "failed" and "ended without closing it" in run["error"]
    r = cli("show", rid, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["run"]["status"] == "failed"
    assert [o["key"] for o in json.loads(r.stdout)["ops"]] == ["relu"]
    # writing is what fails, with one line that says where and what to do
    trace = home.parent / "t.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    line = _one_line(cli("trace", "import", trace, env=env))
    assert line == (f"opscope: error: cannot write the run store at {home / 'runs.duckdb'}: read-only file system; "
                    f"set OPSCOPE_HOME to a writable folder")


@pytest.mark.multiprocess
def test_reads_do_not_write_and_the_next_writer_marks_the_dead_run_failed(opscope_home):
    rid = _dead_running_run(opscope_home)
    path = opscope_home / "runs.duckdb"
    before = (path.stat().st_mtime_ns, path.read_bytes())
    store = RunStore()
    assert store.get_run(rid)["status"] == "failed"          # as seen ...
    assert {r["run_id"]: r["status"] for r in store.list_runs()}[rid] == "failed"
    assert store.op_stats(rid)[0]["key"] == "relu" and len(store.events_frame(rid)["op"]) == 1
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before and not os.path.exists(f"{path}.wal")
    assert store.query("SELECT status FROM runs WHERE run_id = ?", [rid]) == [("running",)]   # ... not written
    # a writer of another process (this one has written nothing yet) records it
    code = "from opscope.profiler.store import RunStore; RunStore().create_run(model='m2', backend='numpy')"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, OPSCOPE_HOME=str(opscope_home)))
    assert store.query("SELECT status FROM runs WHERE run_id = ?", [rid]) == [("failed",)]


def test_an_absent_store_reads_as_empty_and_creates_nothing(tmp_path):
    home = tmp_path / "never-made"
    store = RunStore(home / "runs.duckdb")
    assert store.list_runs() == [] and store.query("SELECT count(*) FROM events") == [(0,)]
    with pytest.raises(UsageError, match="unknown run"):
        store.get_run("abc")
    assert not home.exists()


# --- a full disk --------------------------------------------------------------------------------------
@pytest.mark.multiprocess
def test_a_full_disk_gives_one_line_and_the_runs_still_read(tmpfs, cli, tmp_path):
    home = tmpfs("8m")
    env = {"OPSCOPE_HOME": str(home)}
    rid = _dead_running_run(home)
    filler = home / "filler"
    with open(filler, "wb", buffering=0) as f:       # fill what is left of the disk
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:
            pass
    trace = tmp_path / "big.json"                    # more events than the disk can take
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i % 50}", "ts": i, "dur": 1, "pid": 1,
                                                  "tid": 1} for i in range(20_000)]}))
    r = cli("trace", "import", trace, env=env)
    line = _one_line(r, r.returncode)
    assert r.returncode in (1, 2) and "no space left on device" in line and str(home / "runs.duckdb") in line
    for args in (("runs",), ("show", rid)):          # reading needs no space
        r = cli(*args, env=env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    filler.unlink()                                   # space again: the dead run is recorded failed, events kept
    store = RunStore(home / "runs.duckdb")
    store.create_run(model="m2", backend="numpy")
    assert store.query("SELECT status, events FROM runs WHERE run_id = ?", [rid]) == [("failed", 1)]


@pytest.mark.multiprocess
def test_a_file_size_limit_while_writing_is_one_line_not_a_traceback(tmp_path):
    """RLIMIT_FSIZE (ulimit -f) in a child: a write past it fails with EFBIG, the way a full disk fails."""
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "from opscope.app.cli import main\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))\n"
            "main(sys.argv[1:])\n")
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1,
                                                  "tid": 1} for i in range(50_000)]}))
    r = subprocess.run([sys.executable, "-c", code, "trace", "import", str(trace)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OPSCOPE_HOME=str(tmp_path / "home")))
    line = _one_line(r, 1)
    assert "cannot write the run store" in line and "ulimit" in line


# --- homes that are not folders, damaged stores ----------------------------------------------------
@pytest.mark.parametrize("case", ["file", "under-a-file", "proc", "sys"])
def test_a_home_that_cannot_be_a_folder_is_one_line_exit_2(tmp_path, case, capsys, monkeypatch):
    from test_trace_import import opscope_main
    home = {"file": tmp_path / "home", "under-a-file": tmp_path / "home" / "sub",
            "proc": "/proc/opscope-home", "sys": "/sys/opscope-home"}[case]
    (tmp_path / "home").write_text("not a folder")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    commands = [("trace", "import", trace)] + ([("runs",), ("show", "abc")] if case in ("file", "under-a-file") else [])
    for args in commands:
        code, out, err = opscope_main(capsys, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
        assert str(home) in err and "OPSCOPE_HOME" in err, err
    assert not os.path.exists(str(home)) or os.path.isfile(str(home))


# random bytes from a fixed seed: test ids must be the same in every pytest-xdist worker
@pytest.mark.parametrize("content", [b"", b"garbage" * 1000, random.Random(0).randbytes(20_000)],
                         ids=["empty", "garbage", "random"])
def test_a_damaged_store_is_one_line_exit_2(opscope_home, capsys, content):
    from test_trace_import import opscope_main
    (opscope_home / "runs.duckdb").write_bytes(content)
    for args in (("runs",), ("show", "abc"), ("trace", "export", "abc")):
        code, out, err = opscope_main(capsys, *args)
        if content == b"":          # DuckDB takes an empty file as a new database: reads as empty
            assert code in (0, 2) and "Traceback" not in err
            continue
        assert code == 2 and len(err.strip().splitlines()) == 1, (args, err)
        assert str(opscope_home / "runs.duckdb") in err and "move it away" in err, err


@pytest.mark.multiprocess
def test_a_damaged_store_through_the_cli(opscope_home, cli):
    (opscope_home / "runs.duckdb").write_bytes(b"garbage" * 1000)
    line = _one_line(cli("runs"))
    assert "is not a run store opscope can read" in line


# --- privacy ------------------------------------------------------------------------------------------
def test_the_store_and_its_folder_are_private(tmp_path, monkeypatch):
    home = tmp_path / "fresh" / "home"
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    store = RunStore()
    store.create_run(model="m", backend="numpy")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "runs.duckdb").stat().st_mode) == 0o600


@pytest.mark.multiprocess
def test_an_existing_open_store_is_made_private_when_a_writer_opens_it(tmp_path):
    home = tmp_path / "old-home"
    code = ("import os; os.umask(0o022); from opscope.profiler.store import RunStore; "
            "RunStore(%r).create_run(model='m', backend='numpy')") % str(home / "runs.duckdb")
    subprocess.run([sys.executable, "-c", code], check=True)
    os.chmod(home, 0o755)                              # as an older opscope left them
    os.chmod(home / "runs.duckdb", 0o644)
    RunStore(home / "runs.duckdb").list_runs()         # a reader changes nothing
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    code = ("from opscope.profiler.store import RunStore; "
            "RunStore(%r).create_run(model='m2', backend='numpy')") % str(home / "runs.duckdb")
    subprocess.run([sys.executable, "-c", code], check=True)     # a writer (a new process: once per process)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "runs.duckdb").stat().st_mode) == 0o600


def test_a_shared_sticky_folder_is_never_tightened(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)                           # like /tmp given as the home
    RunStore(shared / "runs.duckdb").create_run(model="m", backend="numpy")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "runs.duckdb").stat().st_mode) == 0o600


# --- the training columns (issue 11's store work keeps them ready) -------------------------------------
def test_events_have_phase_rank_columns_with_defaults_and_old_stores_gain_them(tmp_path):
    import duckdb
    from opscope.profiler.schema import EVENT_COLUMNS, SCHEMA_VERSION
    # schema 2 added phase .. world_size, schema 3 parent and clock (a compiler stack's per-op spans in a region)
    added = ["phase", "fwd_node", "rank", "world_size", "parent", "clock"]
    defaults = ["forward", "", 0, 1, "", ""]
    assert EVENT_COLUMNS[-6:] == added and SCHEMA_VERSION == 3
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))                    # a store as the schema-1 opscope wrote it
    from opscope.profiler.schema import DDL
    for stmt in DDL:
        con.execute(stmt.replace(""",
        phase VARCHAR DEFAULT 'forward', fwd_node VARCHAR DEFAULT '',
        rank INTEGER DEFAULT 0, world_size INTEGER DEFAULT 1""", ""))
    con.execute("INSERT INTO runs (run_id, status, events) VALUES ('old1', 'ok', 1)")
    con.execute("INSERT INTO events (run_id, step, seq, op, start_ns, end_ns) VALUES ('old1', 0, 0, 'relu', 1, 2)")
    con.close()
    store = RunStore(path)
    have = {r[0] for r in store.query("SELECT column_name FROM duckdb_columns() WHERE table_name = 'events'")}
    assert not have & set(added)                                         # a reader changes nothing
    old = store.events_frame("old1", columns=["op", *added])                                     # read: defaults
    assert [old[c][0] for c in added] == defaults
    rid = store.create_run(model="m", backend="numpy")                   # a writer upgrades the store
    have = {r[0] for r in store.query("SELECT column_name FROM duckdb_columns() WHERE table_name = 'events'")}
    assert have >= set(added)
    assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    store.add_events(rid, [ROW])                                         # rows without the new columns
    store.add_event_columns(rid, {**{c: [v] for c, v in zip(EVENT_COLUMNS[1:], ROW)},
                                  "phase": ["backward"], "fwd_node": ["relu"], "rank": [1], "world_size": [2],
                                  "parent": ["region0"], "clock": ["onnxruntime profiler"]})
    got = store.query(f"SELECT {', '.join(added)} FROM events WHERE run_id IN ('old1', ?) "
                      "ORDER BY phase DESC", [rid])
    assert got == [tuple(defaults)] * 2 + [("backward", "relu", 1, 2, "region0", "onnxruntime profiler")]


# --- a store damaged on disk (issue 24): what still reads is listed, and nothing writes into it ---------
def _import(cli, tmp_path, name, n) -> str:
    trace = tmp_path / f"{name}.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i % 50}", "ts": 2 * i, "dur": 1, "pid": 1,
                                                  "tid": 1, "args": {"k": f"v{i}"}} for i in range(n)]}))
    r = cli("trace", "import", trace, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["run_id"]


def _block_of_the_first_rows(path) -> int:
    """The file offset of a storage block that holds only the events' earlier row groups (the first run's rows)."""
    import duckdb
    con = duckdb.connect(str(path), read_only=True)
    try:
        users: dict[int, set] = {}
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        for t in tables:
            for rg, block in con.execute(f"SELECT row_group_id, block_id FROM pragma_storage_info('{t}') "
                                         "WHERE block_id >= 0").fetchall():
                users.setdefault(block, set()).add((t, rg))
        block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
    finally:
        con.close()
    last = max(rg for who in users.values() for t, rg in who if t == "events")    # where later rows went
    only = sorted(b for b, who in users.items() if {t for t, _ in who} == {"events"} and max(rg for _, rg in who) < last)
    assert only, users
    return 3 * 4096 + only[len(only) // 2] * block_size      # three header pages, then the blocks


@pytest.mark.multiprocess
def test_a_corrupted_block_lists_what_still_reads_and_the_next_write_changes_nothing(opscope_home, cli, tmp_path):
    big = _import(cli, tmp_path, "big", 200_000)     # the first row groups of events hold the big run alone
    small = _import(cli, tmp_path, "small", 100)
    path = opscope_home / "runs.duckdb"
    with open(path, "r+b") as f:                     # bytes flipped on disk inside one of the big run's blocks
        f.seek(_block_of_the_first_rows(path) + 1000)
        f.write(b"\xa5" * 8192)
    line = _one_line(cli("trace", "export", big, "-o", tmp_path / "out.json"))
    assert str(path) in line and "damaged" in line and "Corrupt database file" in line
    r = cli("runs")                                  # the runs that read, then the one line
    line = _one_line(r)
    assert "damaged" in line and "`opscope runs` lists the runs it still reads" in line
    assert small in r.stdout and big in r.stdout
    r = cli("runs", "--json")
    _one_line(r)
    readable = {x["run_id"]: x["readable"] for x in json.loads(r.stdout)["runs"]}
    assert readable == {big: False, small: True}
    r = cli("show", small, "--json")                 # a run that reads is still shown
    assert r.returncode == 0 and json.loads(r.stdout)["run"]["events"] == 100, r.stderr
    before = path.read_bytes()
    trace = tmp_path / "new.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    line = _one_line(cli("trace", "import", trace))  # a new run is not written into the damaged file
    assert "opscope will not write into it" in line
    assert path.read_bytes() == before


@pytest.mark.multiprocess
def test_a_truncated_store_is_one_line_and_never_written(opscope_home, cli, tmp_path):
    rid = _import(cli, tmp_path, "big", 50_000)
    path = opscope_home / "runs.duckdb"
    os.truncate(path, path.stat().st_size // 2)
    before = path.read_bytes()
    for args in (("runs",), ("show", rid), ("runs", "rm", "--keep", "0")):
        line = _one_line(cli(*args))
        assert str(path) in line and "damaged" in line and "Could not read enough bytes" in line
    r = cli("runs")
    assert "no run can be read" in r.stdout
    line = _one_line(cli("trace", "import", tmp_path / "big.json"))
    assert "opscope will not write into it" in line
    assert path.read_bytes() == before
    path.rename(tmp_path / "damaged.duckdb")         # what the message says to do: then a fresh store works
    _import(cli, tmp_path, "small", 10)
    r = cli("runs", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["runs"]) == 1, r.stderr


# --- a disk that fills up during a live profile (issue 24: 51 lines, two thread tracebacks) ---------------
@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_disk_that_fills_during_a_profile_is_one_line_and_earlier_runs_stay(tmpfs, cli, tmp_path):
    home = tmpfs("8m")
    env = {"OPSCOPE_HOME": str(home / "home")}
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i % 5}", "ts": i, "dur": 1, "pid": 1,
                                                  "tid": 1} for i in range(100)]}))
    r = cli("trace", "import", trace, "--json", env=env)
    assert r.returncode == 0, r.stderr
    earlier = json.loads(r.stdout)["run_id"]
    st = os.statvfs(home)
    # leave the store room for the run's first rows, not for the whole run
    (home / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - 600_000))
    r = cli("profile", "demo:gpt", "-b", "numpy", "--steps", "30", env=env)
    line = _one_line(r, 1)
    assert "no space left on device" in line and str(home / "home" / "runs.duckdb") in line
    r = cli("runs", "--json", env=env)              # still full: reading needs no space
    assert r.returncode == 0, r.stderr
    assert {x["run_id"]: x["status"] for x in json.loads(r.stdout)["runs"]}[earlier] == "ok"
    (home / "filler").unlink()
    store = RunStore(home / "home" / "runs.duckdb")
    assert store.query("SELECT count(*) FROM events WHERE run_id = ?", [earlier]) == [(100,)]
    assert store.get_run(earlier)["events"] == 100


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_run_the_full_disk_stopped_counts_the_rows_it_stored_and_json_says_why_on_stderr(tmpfs, cli):
    """Issue 33: the run was stored failed with its message, but runs.events said 9,220 while 10,495 rows were
    stored (rows written, their count not), and with --json nothing reached stderr."""
    home = tmpfs("8m")
    env = {"OPSCOPE_HOME": str(home / "home")}
    RunStore(home / "home" / "runs.duckdb").create_run(model="m", backend="numpy")     # the store exists
    st = os.statvfs(home)
    (home / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - 600_000))
    # a process of its own (OMP_NUM_THREADS: run_cli), as a user's: the run it leaves is a dead collector's
    r = cli("profile", "demo:gpt", "-b", "numpy", "--steps", "30", "--json", env={**env, "OMP_NUM_THREADS": "1"})
    line = _one_line(r, 1)
    assert "no space left on device" in line and str(home / "home" / "runs.duckdb") in line
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed" and "no space left on device" in doc["error"], doc
    store = RunStore(home / "home" / "runs.duckdb")
    count = "SELECT count(*) FROM events WHERE run_id = ?"
    stored = store.query(count, [doc["run_id"]])[0][0]
    assert store.get_run(doc["run_id"])["status"] == "failed"          # read while still full: failed, as it was
    assert store.get_run(doc["run_id"])["events"] == stored == doc["events"], (doc, stored)
    (home / "filler").unlink()
    store.create_run(model="m2", backend="numpy")      # the next writer records the dead run failed, rows counted
    run = store.get_run(doc["run_id"])
    assert run["status"] == "failed" and run["events"] == store.query(count, [doc["run_id"]])[0][0] == stored


def test_rows_and_their_count_are_stored_together_or_not_at_all(opscope_home):
    """The count's UPDATE failing after the rows' INSERT (a full disk between the two, here another writer's
    open transaction on the run's row) left rows stored that runs.events did not count. Now both roll back."""
    import duckdb
    store = RunStore()
    rid = store.create_run(model="m", backend="numpy")
    store.add_events(rid, [ROW])
    with store.connect() as other:
        other.execute("BEGIN TRANSACTION")
        other.execute("UPDATE runs SET events = 0 WHERE run_id = ?", [rid])
        with pytest.raises(duckdb.Error):
            store.add_events(rid, [ROW] * 5)
        other.execute("ROLLBACK")
    count = "SELECT count(*) FROM events WHERE run_id = ?"
    assert store.get_run(rid)["events"] == store.query(count, [rid])[0][0] == 1
    store.add_events(rid, [ROW] * 2)
    store.finish_run(rid, "failed", error="stopped")
    assert store.get_run(rid)["events"] == store.query(count, [rid])[0][0] == 3
