"""One writer at a time, and a run is ok only when the store holds every event its runner sent (issue 24).

Concurrent `opscope profile`s into one home once lost batches silently (81,836 of 82,000 events, status
ok) and left stores DuckDB could no longer open: DuckDB reads the file before it takes its own lock, so
an open that overlapped another process's checkpoint worked from a stale picture. store.py now takes
an flock before DuckDB opens the file. These tests run real processes on one real store.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import duckdb
import pytest

from opscope.profiler.store import RunStore, StoreError

pytestmark = pytest.mark.multiprocess


def _opscope(home, *args):
    """`opscope ARGS` started in the background (conftest.run_cli's way of running it)."""
    env = dict(os.environ, OPSCOPE_HOME=str(home))
    return subprocess.Popen([sys.executable, "-m", "opscope.app", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


class _Reader(threading.Thread):
    """Reads the store the whole time, the way `opscope serve` and `opscope runs` do: every read must work."""

    def __init__(self, store):
        super().__init__(daemon=True)
        self.store, self.reads, self.errors = store, 0, []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                for r in self.store.list_runs():
                    self.store.query("SELECT count(*) FROM events WHERE run_id = ?", [r["run_id"]])
                self.reads += 1
            except StoreError as e:
                self.errors.append(str(e))
            time.sleep(0.02)


class _Served(threading.Thread):
    """A real `opscope serve` on the same home, asked what its pages ask (/metrics reads every stored run,
    the live endpoint one run) the whole time: it must answer, never 500, and outlive the writers."""

    def __init__(self, home):
        super().__init__(daemon=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # its request log goes to a file: a pipe nobody reads would fill and stall the server
        self.log = open(os.path.join(home, "serve.log"), "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "serve", "--no-token", "--port",
                                      str(self.port)], stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, OPSCOPE_HOME=str(home)))
        self.answers, self.errors, self.run_ids = 0, [], []
        self.stop = threading.Event()

    def _get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def run(self):
        deadline = time.monotonic() + 120
        while not self.stop.is_set():
            try:
                codes = [self._get("/metrics")] + [self._get(f"/_opscope/live?run={r}") for r in self.run_ids[-2:]]
            except OSError:                 # not listening yet
                if time.monotonic() > deadline:
                    self.errors.append("serve never answered")
                    return
                time.sleep(0.2)
                continue
            if any(c >= 500 for c in codes):
                self.errors.append(codes)
            self.answers += 1
            time.sleep(0.05)


@pytest.mark.slow
def test_concurrent_profiles_into_one_home_keep_every_event_and_the_store_reads(opscope_home, cli):
    store = RunStore()
    reader = _Reader(store)
    reader.start()
    served = _Served(opscope_home)
    served.start()
    spec = ["profile", "demo:mlp", "-b", "numpy", "--steps", "30", "--json"]
    done = []
    try:
        for group in (3, 3, 3):                     # three triples, each group at once (CI time: 13 runs took 225 s)
            procs = [_opscope(opscope_home, *spec) for _ in range(group)]
            for p in procs:
                out, err = p.communicate(timeout=600)
                assert p.returncode == 0, err
                assert "Traceback" not in err, err
                done.append(json.loads(out))
                served.run_ids.append(done[-1]["run_id"])
            r = cli("runs", "--json")                # another process reads between the groups
            assert r.returncode == 0, r.stderr
    finally:
        reader.stop.set()
        served.stop.set()
        reader.join()
        served.join()
        alive = served.proc.poll() is None
        served.proc.terminate()
        served.proc.wait(timeout=30)
        served.log.close()
    assert not reader.errors, reader.errors[:3]
    assert reader.reads > 0
    assert alive and not served.errors and served.answers > 0, (alive, served.errors[:3], served.answers)
    runs = {r["run_id"]: r for r in store.list_runs()}
    assert len(runs) == len(done) == 9
    sent = set()
    for d in done:
        run = runs[d["run_id"]]
        # ok means the store's own count plus what the sender dropped is what the runner said it sent
        assert run["status"] == "ok", (run["status"], run["error"])
        held = store.query("SELECT count(*) FROM events WHERE run_id = ?", [d["run_id"]])[0][0]
        assert held == run["events"] > 0
        sent.add(held + (run["dropped"] or 0))
    assert len(sent) == 1                            # the same model and steps: the same events, every run


_WAITS = """
import os, sys, time, torch
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(3):
    m(torch.ones(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 1:                       # the test takes events out of the store here, then lets us go on
        open(sys.argv[1] + ".ready", "w").close()
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
"""


def test_a_run_whose_events_the_store_lost_is_incomplete_never_ok(opscope_home, tmp_path, cli):
    """Rows that vanish from the store after the collector wrote them (what the race did) are caught at
    the end by counting the store itself; the collector's own tally would have said ok."""
    script = tmp_path / "train.py"
    script.write_text(_WAITS)
    flag = tmp_path / "go"
    p = _opscope(opscope_home, "profile", "-b", "torch:cpu", "--engine", "eager", "--json", "--",
                 sys.executable, script, flag)
    store = RunStore()
    try:
        deadline = time.monotonic() + 300
        held = 0
        while time.monotonic() < deadline and p.poll() is None:
            runs = store.list_runs()
            if runs and os.path.exists(f"{flag}.ready"):
                rid = runs[0]["run_id"]
                held = store.query("SELECT count(*) FROM events WHERE run_id = ?", [rid])[0][0]
                if held:
                    break
            time.sleep(0.1)
        assert held, "no event reached the store before the script waited"
        store.query("DELETE FROM events WHERE run_id = ? AND step = 0", [rid])    # another process loses rows
    finally:
        flag.write_text("")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, err                    # the profile says so, in one line
    assert len(err.strip().splitlines()) == 1 and f"run {rid} is incomplete" in err and "missing" in err, err
    run = store.get_run(rid)
    assert run["status"] == "incomplete" and "missing" in run["error"], run
    r = cli("runs", "--json")
    assert {x["run_id"]: x["status"] for x in json.loads(r.stdout)["runs"]}[rid] == "incomplete"


def test_a_writer_that_cannot_get_the_store_says_who_holds_it(opscope_home, monkeypatch):
    from opscope.profiler import store as store_module
    RunStore().create_run(model="m", backend="numpy")
    code = ("import sys; from opscope.profiler.store import RunStore\n"
            "with RunStore().connect():\n    print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OPSCOPE_HOME=str(opscope_home)))
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(store_module, "_LOCK_WAIT_S", 0.3)     # the bound, shortened: what happens after it
        with pytest.raises(StoreError) as e:
            RunStore().create_run(model="m2", backend="numpy")
        assert e.value.exit_code == 1
        assert str(e.value) == (f"the run store at {opscope_home / 'runs.duckdb'} has been held by another process "
                                f"(pid {holder.pid}) for over 0.3 s; try again when it is done")
        # reading waits for the writer the same way: nobody opens the file while it is being written
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            RunStore().list_runs()
    finally:
        holder.communicate("", timeout=60)
    assert [r["model"] for r in RunStore().list_runs()] == ["m"]


# --- a store someone sends you -----------------------------------------------------------------------
def _crafted(path, view_sql):
    """A store of the right shape whose `runs` is a view that wants something outside the file."""
    from opscope.profiler.schema import DDL
    con = duckdb.connect(str(path))
    for stmt in DDL:
        con.execute(stmt)
    con.execute("DROP TABLE runs")
    con.execute(f"CREATE VIEW runs AS {view_sql}")
    con.close()


def test_a_crafted_store_whose_runs_read_another_file_is_refused_and_left_as_it_was(opscope_home, tmp_path, cli):
    canary = tmp_path / "secret.csv"
    canary.write_text("SECRET-TOKEN\n")
    path = opscope_home / "runs.duckdb"
    _crafted(path, f"SELECT content AS run_id FROM read_text('{canary}')")
    before = path.read_bytes()
    for args in (("runs",), ("runs", "--json"), ("show", "abc")):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "SECRET-TOKEN" not in r.stdout + r.stderr
        assert str(path) in lines[0] and "not a store opscope wrote" in lines[0], lines[0]
    assert path.read_bytes() == before
    trace = tmp_path / "t.json"                    # a writer refuses it too, before it writes anything
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    r = cli("trace", "import", trace)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "holds views or macros (runs)" in r.stderr and path.read_bytes() == before


def test_readers_open_with_extension_loading_and_outside_access_off(opscope_home):
    """A store can name an extension (a type, a function, a view) or a URL; a reader loads, installs and
    fetches nothing, whatever the file says."""
    store = RunStore()
    store.create_run(model="m", backend="numpy")
    with store.connect(read_only=True) as con:
        got = con.execute("SELECT current_setting('autoload_known_extensions'), "
                          "current_setting('autoinstall_known_extensions'), "
                          "current_setting('enable_external_access')").fetchone()
        assert got == (False, False, False)
        with pytest.raises(duckdb.Error, match="disabled"):
            con.execute("SELECT * FROM read_parquet('https://example.invalid/runs.parquet')")
        with pytest.raises(duckdb.Error, match="not in the catalog, but it exists in the spatial extension"):
            con.execute("SELECT st_point(1, 2)")      # autoload would fetch and load it


def test_a_reader_connection_cannot_write_the_store(opscope_home):
    store = RunStore()
    rid = store.create_run(model="m", backend="numpy")
    path = opscope_home / "runs.duckdb"
    before = path.read_bytes()
    with store.connect(read_only=True) as con:
        for sql in (f"UPDATE runs SET model = 'x' WHERE run_id = '{rid}'", "CREATE TABLE t (a INT)",
                    f"COPY runs TO '{opscope_home / 'out.csv'}'", "INSTALL httpfs", "LOAD httpfs"):
            with pytest.raises(duckdb.Error):
                con.execute(sql)
    assert path.read_bytes() == before and not (opscope_home / "out.csv").exists()


_READS_FOREVER = """
import sys, time
from opscope.profiler.store import RunStore
store = RunStore()
time.sleep(float(sys.argv[1]))                 # staggered: the readers' shared locks overlap back to back
print("reading", flush=True)
while True:
    with store.connect(read_only=True):
        time.sleep(0.3)
"""


def test_a_writer_gets_the_store_while_readers_hold_it_back_to_back(opscope_home, monkeypatch):
    """Writers go first: three readers whose shared locks always overlap (a dashboard polling, `runs`, a
    monitor) never leave a gap, and a writer waited out the whole bound (120 s) under load; the turnstile
    lets the readers in hand finish and holds new ones until the writer is through."""
    from opscope.profiler import store as store_module
    RunStore().create_run(model="m", backend="numpy")
    env = dict(os.environ, OPSCOPE_HOME=str(opscope_home))
    readers = [subprocess.Popen([sys.executable, "-c", _READS_FOREVER, str(0.1 * i)], stdout=subprocess.PIPE,
                                text=True, env=env) for i in range(3)]
    try:
        for r in readers:
            assert r.stdout.readline().strip() == "reading"
        time.sleep(1.0)
        monkeypatch.setattr(store_module, "_LOCK_WAIT_S", 20.0)   # without the turnstile: never a gap, refused
        rid = RunStore().create_run(model="m2", backend="numpy")
        assert RunStore().get_run(rid)["model"] == "m2"
    finally:
        for r in readers:
            r.kill()
            r.wait(timeout=30)
