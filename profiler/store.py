"""The run store: every profiled run, its events, memory, tensor summaries, hardware samples, stacks.

    store = RunStore()                                   # $OPSCOPE_HOME/runs.duckdb
    run_id = store.create_run(model="demo:gpt", backend="torch:cpu", device="cpu")
    store.add_events(run_id, rows)                       # tuples in EVENT_COLUMNS order, without run_id
    store.finish_run(run_id, status="ok")
    store.op_stats(run_id)                               # per-op aggregates, in SQL

One writer at a time, by our own lock. Collectors, imports and the web server share one file by
holding connections only for the work at hand (open, do the work, close). DuckDB's own file lock
cannot be the mutex for that: a connection reads the file *before* it takes DuckDB's lock, so an open
that overlaps another process's checkpoint (which rewrites blocks and truncates the file) starts from
a stale picture; its next checkpoint then drops committed rows or points at blocks past the end
("Could not read enough bytes", "Corrupt database file: computed checksum"). So every connection
first takes an flock on `runs.duckdb.lock` -- exclusive to write, shared to read -- and lets go only
after DuckDB has closed the file: no process ever opens the file while another may be writing it.
Writers go first (`runs.duckdb.turn`, held while a writer waits): readers polling back to back
would otherwise keep a writer out.

Readers open read-only with DuckDB's extension autoloading and autoinstalling off and no access to
other files or the network: a store someone sends you can make opscope fetch, load or read nothing.
A writer first checks, read-only, that the file holds only tables (a view or macro would run its SQL
in a connection that may read files). A store found damaged is never written again: a `.damaged` note
beside it, naming the file, stops every writer, and `readable_runs()` says what still reads.

Reading never writes: readers open the file read-only (a store on a read-only disk, or a full one,
still reads), and an absent store reads as empty. The first writer of a process creates the store
private to the user (folder 0700, file 0600), upgrades its tables, and marks failed the runs whose
collecting process died; until then a reader shows such a run as failed without writing it. A store
that cannot be opened or written is a StoreError: one line with the path and what to do.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import random
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import numpy as np

try:
    import fcntl
except ImportError:        # Windows: no flock; DuckDB's own lock is all there is
    fcntl = None

from opscope.runtime.errors import OpscopeError, UsageError, first_line
from opscope.runtime.home import HOME_ENV, opscope_home, private_file, private_folder

from .schema import ADDED_EVENT_COLUMNS, DDL, EVENT_COLUMNS, FLOW_COLUMNS, IMPORT_TABLES, KERNEL_ARG_COLUMNS, MIGRATIONS, \
    SCHEMA_VERSION, SPAN_COLUMNS
from .stats import CACHE_DDL

MEMORY_COLUMNS = ["step", "seq", "t_ns", "backend", "live_bytes", "alloc_bytes", "free_bytes"]
TENSOR_COLUMNS = ["step", "seq", "slot", "shape", "dtype", "count", "min", "max", "mean", "std", "nan", "inf",
                  "hist", "hist_lo", "hist_hi"]
HARDWARE_COLUMNS = ["t_ns", "cpu_percent", "mem_bytes", "gpu_util", "gpu_mem_bytes", "temperature_c", "power_w"]
STACK_COLUMNS = ["t_ns", "dur_ns", "thread", "depth", "frame"]
RUN_COLUMNS = ["run_id", "model", "backend", "device", "engine", "description_hash", "description", "status", "error",
               "started_at", "ended_at", "host", "versions", "steps", "warmup", "events", "dropped", "config",
               "parent_run", "source"]

# numpy dtype per column, so a batch of rows becomes columns DuckDB scans without a copy per value
_INT = {"step", "seq", "thread", "depth", "start_ns", "end_ns", "bytes", "flops", "live_bytes", "t_ns", "alloc_bytes",
        "free_bytes", "count", "nan", "inf", "mem_bytes", "gpu_mem_bytes", "dur_ns", "rank", "world_size"}
_FLOAT = {"min", "max", "mean", "std", "hist_lo", "hist_hi", "cpu_percent", "gpu_util", "temperature_c", "power_w"}
_BOOL = {"fallback"}

_LOCK_WAIT_S = 120.0           # a writer waits this long for the store; then the run fails, saying why
# DuckDB settings of every connection: nothing a store file holds can make DuckDB fetch or load code
_SAFE = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}
# and readers reach no other file and no network (a view in a crafted store cannot read ~/.ssh)
_READ_ONLY = {**_SAFE, "enable_external_access": False}
# what DuckDB says of a file that is damaged (a note then stops every writer), and of one it cannot read at all
_DAMAGE = ("corrupt database file", "could not read enough bytes", "checksum")
_UNREADABLE = _DAMAGE + ("not a valid duckdb database", "serialization", "storage version")
# database files a writer of this process has prepared, by path and file identity: a store moved away or deleted
# (what the damaged-store message tells a user to do) is a new file to prepare, even in a long-lived process
_ready: set[tuple] = set()
_ready_lock = threading.Lock()
_open: dict[str, list[bool]] = {}  # file -> read_only flags of this process's open connections (nesting)
# NOTE: threads of one process share one DuckDB instance per file; a connection opened while another
# thread closed the last one (and with it the instance) broke the instance's catalog ("pandas_scan does
# not exist"). Connections in a process take turns; DuckDB serializes writers anyway.
_PROCESS_LOCK = threading.RLock()


def _column(name: str, values) -> np.ndarray:
    """One column as a numpy array DuckDB scans without a copy per value (NULLs become 0/False/NaN)."""
    return _masked_column(name, values)[0]


def _masked_column(name: str, values) -> tuple[np.ndarray, np.ndarray | None]:
    """(array, NULL mask or None). Numeric columns with None (or NaN in an integer column) get a mask,
    so a batch with unknown values still goes in as one columnar INSERT."""
    if isinstance(values, np.ma.MaskedArray) and values.dtype != object:   # masked entries are NULLs
        mask = np.ma.getmaskarray(values)
        return np.ascontiguousarray(values.filled(np.nan if values.dtype.kind == "f" else 0)), mask
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values, None
    if name in _INT or name in _BOOL:
        dtype = np.int64 if name in _INT else bool
        try:
            return np.asarray(values, dtype=dtype), None
        except (TypeError, ValueError):      # None (or NaN) among the values: NULLs
            pass
        n = len(values)
        mask = np.fromiter((v is None or v != v for v in values), dtype=bool, count=n)
        return np.fromiter((0 if m else v for v, m in zip(values, mask.tolist())), dtype=dtype, count=n), mask
    if name in _FLOAT:                       # NaN scans as NULL
        return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64), None
    if isinstance(values, np.ndarray):       # already an object array (an import's text columns): no copy
        return values, None
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr, None


def _constant_text(arr) -> tuple | None:
    """(value,) when an object column holds one text (or None) in every row of a large batch, else None."""
    if not (isinstance(arr, np.ndarray) and arr.dtype == object and len(arr)):
        return None
    first = arr[0]
    if arr.ndim == 1 and arr.strides[0] == 0 and (first is None or type(first) is str):
        return (first,)             # one value broadcast (importers.common._objects): never handed to DuckDB as is
    if len(arr) < 4096:
        return None
    if not (first is None or type(first) is str):
        return None
    # two probes first: a column that varies is usually told by them, without comparing every row
    same = all(v == first for v in (arr[-1], arr[len(arr) // 2])) and bool(np.equal(arr, first).all())
    return (first,) if same else None


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str, default: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return default
    # torch's version as installed when this process has not imported it: importing it costs a second
    # or more, and an import of a trace (`trace import`, a web upload) never needs torch otherwise
    torch = sys.modules.get("torch")
    return {"python": platform.python_version(),
            "torch": torch.__version__ if torch is not None else installed("torch", "not installed"),
            "numpy": np.__version__, "duckdb": duckdb.__version__, "opscope": installed("opscope", "0+unknown")}


class StoreError(OpscopeError):
    """The run store cannot be opened or written: a read-only or full disk, a file where its folder
    should be, a damaged database. Exit 2 (what the user must change), 1 when the disk filled up."""

    def __init__(self, message: str, exit_code: int = 2, damaged: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.damaged = damaged          # the file is damaged: RunStore.readable_runs says what still reads


class RunStore:
    """The run store: every profiled, imported or trained run under $OPSCOPE_HOME (runs.duckdb), the one that
    `opscope runs`, `show`, `serve` and the exporters read. `op_stats(run_id)` gives per-op aggregates."""

    def __init__(self, path: str | os.PathLike | None = None):
        # nothing touches the disk here: readers open the file read-only, the first writer creates it
        self.path = Path(path) if path is not None else opscope_home() / "runs.duckdb"
        self._home = path is None

    # --- connections ---------------------------------------------------------------------
    @contextlib.contextmanager
    def connect(self, read_only: bool = False):
        """A short-lived connection; waits while another process holds the file's lock.

        read_only: for readers. It never writes, works where the store cannot be written, and an
        absent store reads as an empty one. A read inside an open writer's connection shares it.
        """
        key = str(self.path.absolute())
        with _PROCESS_LOCK, _store_errors(self, writing=not read_only):
            held = _open.setdefault(key, [])
            lock = None
            if held:                       # DuckDB wants one configuration per file and process
                read_only = held[0]
            elif read_only and not self._exists():
                con = _empty_store()
                try:
                    yield con
                finally:
                    con.close()
                return
            else:                          # the first connection of this process: take the store's lock
                if not read_only:
                    private_folder(self.path.parent)
                    self.refuse_if_damaged()
                lock = _take_lock(self, exclusive=not read_only)
            held.append(read_only)
            try:
                if lock is not None and not read_only:
                    self._prepare()
                with self._connect(read_only) as con:
                    yield con
            finally:
                held.pop()
                if lock is not None:
                    _release_lock(lock, exclusive=not read_only)

    @contextlib.contextmanager
    def _connect(self, read_only: bool = False):
        deadline = time.monotonic() + _LOCK_WAIT_S
        delay = 0.005
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only, config=_READ_ONLY if read_only else _SAFE)
                break
            except duckdb.IOException as e:
                # our lock keeps opscope's processes apart; this is someone else's (the duckdb CLI, an old opscope)
                if "lock" not in str(e).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(delay * (0.5 + random.random()))   # jitter: two pollers do not stay in step
                delay = min(delay * 2, 0.04)
        try:
            yield con
        finally:
            con.close()

    def _exists(self) -> bool:
        """Whether there is a store to read; a home that is a file (or under one) is an error, not empty."""
        try:
            os.stat(self.path)
            return True
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            raise StoreError(_not_a_folder(self)) from None

    @property
    def damaged_note(self) -> Path:
        return Path(f"{self.path}.damaged")

    def refuse_if_damaged(self) -> None:
        """A store seen damaged is never written again: a write (and its checkpoint) could spread the damage
        over runs that still read. The note names the file it was written for: a store moved away and
        replaced by a fresh one is not refused."""
        try:
            ident, _, why = self.damaged_note.read_text(errors="replace").partition("\n")
        except FileNotFoundError:
            return
        except OSError:
            ident, why = "", "unknown"
        if ident != self._identity():
            with contextlib.suppress(OSError):
                self.damaged_note.unlink()
            return
        raise StoreError(_damaged(self, why.strip()[:300]), damaged=True)

    def _identity(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError:
            return "absent"
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def note_damage(self, why: str) -> None:
        """Remember that the store is damaged, so no later writer touches it (best effort: a read-only home
        cannot hold the note, and nobody can write there anyway)."""
        with contextlib.suppress(OSError):
            tmp = Path(f"{self.damaged_note}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{self._identity()}\n{why}\n")
            os.replace(tmp, self.damaged_note)

    def readable_runs(self) -> tuple[list[dict], str | None]:
        """(the runs a damaged store still reads, None or why not even its runs table reads). Each run
        carries `readable`: whether every column of its events still reads."""
        try:
            with self.connect(read_only=True) as con:
                try:
                    rows = con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY started_at DESC").fetchall()
                except duckdb.Error as e:
                    return [], first_line(e)
                runs = []
                for run in map(_run_dict, rows):
                    try:
                        con.execute("SELECT count(*), sum(hash(COLUMNS(*))) FROM events WHERE run_id = ?",
                                    [run["run_id"]]).fetchall()
                        run["readable"] = True
                    except duckdb.Error:
                        run["readable"] = False
                    runs.append(_as_seen(run))
                return runs, None
        except StoreError as e:
            return [], str(e)

    def _check_shape(self) -> None:
        """Before a writer touches a file: only tables, as opscope makes them. A view or macro there (a store
        someone sent) would run its SQL in a connection that may read files; refuse it, read-only."""
        with self._connect(read_only=True) as con:
            found = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal UNION ALL "
                                "SELECT function_name FROM duckdb_functions() WHERE function_type IN "
                                "('macro', 'table_macro') AND NOT internal LIMIT 3").fetchall()
        if found:
            raise StoreError(f"the run store at {self.path} holds views or macros ({', '.join(r[0] for r in found)}): "
                             f"it is not a store opscope wrote; move it away, or set {HOME_ENV} to another folder")

    def _prepare(self) -> None:
        """A writer's first connection in this process: a private folder and file, current tables, and
        the runs of dead collectors marked failed (the write that readers leave to writers)."""
        with _ready_lock:
            if self._file_key() in _ready:
                return
            private_folder(self.path.parent)
            new = not self.path.exists()
            if not new:
                self._check_shape()
            old_mask = os.umask(0o077) if new else None      # born private: no moment readable by others
            try:
                with self._connect() as con:
                    for stmt in DDL + MIGRATIONS:
                        con.execute(stmt)
                    con.execute(CACHE_DDL)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                    _mark_dead_runs_failed(con)
            finally:
                if old_mask is not None:
                    os.umask(old_mask)
            for f in (self.path, Path(f"{self.path}.wal")):
                private_file(f)
            _ready.add(self._file_key())

    def _file_key(self) -> tuple | None:
        """(path, device, inode) of the store's file, None while there is none: which file a writer prepared
        (_identity also holds size and mtime, which every write changes)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return str(self.path.absolute()), st.st_dev, st.st_ino

    def query(self, sql: str, params=()) -> list[tuple]:
        """Run one statement; a SELECT (or WITH/SHOW/DESCRIBE) reads, anything else writes."""
        reads = (sql.split(None, 1) or [""])[0].upper() in ("SELECT", "WITH", "SHOW", "DESCRIBE", "EXPLAIN", "FROM")
        with self.connect(read_only=reads) as con:
            return con.execute(sql, list(params)).fetchall()

    # --- runs ----------------------------------------------------------------------------
    def create_run(self, *, model: str, backend: str, device: str = "", engine: str = "graph",
                   description: dict | None = None, steps: int = 1, warmup: int = 0, config: dict | None = None,
                   parent_run: str | None = None, source: str | None = None, run_id: str | None = None) -> str:
        run_id = run_id or uuid.uuid4().hex[:12]
        desc_json = json.dumps(description, sort_keys=True, default=str) if description is not None else None
        digest = None
        if description is not None:
            digest = description.get("digest") if isinstance(description, dict) else None
            if not digest:
                import hashlib
                digest = hashlib.sha256(desc_json.encode()).hexdigest()[:16]
        row = [run_id, model, backend, device, engine, digest, desc_json, "running", None, time.time(), None,
               socket.gethostname(), json.dumps(versions()), steps, warmup, 0, 0,
               json.dumps({**(config or {}), "collector": {"host": socket.gethostname(), "pid": os.getpid()}},
                          default=str), parent_run, source]
        with self.connect() as con:
            con.execute(f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' * len(row))})", row)
        return run_id

    def finish_run(self, run_id: str, status: str = "ok", error: str | None = None, dropped: int = 0) -> None:
        with self.connect() as con:
            # the count is the rows themselves, whatever stopped the run (a writer's tally can be short)
            con.execute("UPDATE runs SET status = $status, error = $error, dropped = greatest(dropped, $dropped), "
                        f"ended_at = $t, events = ({_STORED}) WHERE run_id = $run",
                        {"status": status, "error": error, "dropped": int(dropped), "t": time.time(), "run": run_id})
            # the run's events are final: its default per-op table is computed now, once, so views
            # of a big run read a few rows (module/node tables are cached on their first query)
            from .stats import cache
            try:
                cache(con, run_id, ["op"])
            except duckdb.Error:      # a table that cannot be cached is aggregated live: still a finished run
                pass

    def update_run(self, run_id: str, **fields) -> None:
        """Set runs columns (config is merged as JSON; dropped is added)."""
        if not fields:
            return
        with self.connect() as con:
            if "config" in fields:
                old = con.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchone()
                merged = json.loads(old[0] or "{}") if old else {}
                merged.update(fields["config"])
                fields["config"] = json.dumps(merged, default=str)
            sets, vals = [], []
            for k, v in fields.items():
                if k not in RUN_COLUMNS:
                    raise ValueError(f"runs has no column {k}")
                sets.append(f"{k} = {k} + ?" if k == "dropped" else f"{k} = ?")
                vals.append(v)
            con.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = ?", vals + [run_id])

    def list_runs(self) -> list[dict]:
        with self.connect(read_only=True) as con:
            cur = con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY started_at DESC")
            return [_as_seen(_run_dict(r)) for r in cur.fetchall()]

    def get_run(self, run_id: str, *, con=None) -> dict:
        rid = (run_id or "").strip()
        if con is None:
            with self.connect(read_only=True) as c:
                return self.get_run(rid, con=c)
        rows = [] if not rid else con.execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE starts_with(run_id, ?) ORDER BY started_at DESC",
            [rid]).fetchall()
        exact = [r for r in rows if r[0] == rid]
        if exact:
            return _as_seen(_run_dict(exact[0]))
        if not rows:
            raise UsageError(f"unknown run {rid!r}: `opscope runs` lists them")
        if len(rows) > 1:
            raise UsageError(f"run id {rid!r} is ambiguous ({len(rows)} runs start with it): give more characters")
        return _as_seen(_run_dict(rows[0]))

    def delete_run(self, run_id: str) -> None:
        rid = self.get_run(run_id)["run_id"]
        with self.connect() as con:
            for t in ("events", "memory", "tensors", "hardware", "stacks", "artifacts", *IMPORT_TABLES, "op_stats_cache",
                      "runs"):
                con.execute(f"DELETE FROM {t} WHERE run_id = ?", [rid])
        from .kept import forget          # its kept files beside the store (the timeline's spans), too
        forget(self, rid)

    # --- writing -------------------------------------------------------------------------
    def add_events(self, run_id: str, rows) -> int:
        rows = list(rows)
        if not rows:
            return 0
        # rows may stop before the columns added later (phase, ...): those take their defaults
        return self.add_event_columns(run_id, dict(zip(EVENT_COLUMNS[1:], zip(*rows))))

    def add_event_columns(self, run_id: str, cols: dict, *, con=None) -> int:
        """The fast path: one batch as columns (numpy arrays or sequences), keyed by EVENT_COLUMNS names."""
        if con is None:
            with self.connect() as c:
                return self.add_event_columns(run_id, cols, con=c)
        with counted(con):
            n = self._insert("events", EVENT_COLUMNS, run_id, cols, con=con)
            if n:
                con.execute("UPDATE runs SET events = events + ? WHERE run_id = ?", [n, run_id])
        return n

    def add_memory(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("memory", MEMORY_COLUMNS, run_id, rows, con=con)

    def add_memory_columns(self, run_id: str, cols: dict, *, con=None) -> int:
        """Memory samples as columns keyed by MEMORY_COLUMNS (an import's millions of samples)."""
        return self._insert("memory", ["run_id", *MEMORY_COLUMNS], run_id, cols, con=con)

    def add_tensors(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("tensors", TENSOR_COLUMNS, run_id, rows, con=con)

    def add_hardware(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("hardware", HARDWARE_COLUMNS, run_id, rows, con=con)

    def add_stacks(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("stacks", STACK_COLUMNS, run_id, rows, con=con)

    def add_stack_columns(self, run_id: str, cols: dict, *, con=None) -> int:
        """Python stack spans as columns keyed by STACK_COLUMNS (an import's hundreds of thousands of frames)."""
        return self._insert("stacks", ["run_id", *STACK_COLUMNS], run_id, cols, con=con)

    def add_artifact(self, run_id: str, kind: str, name: str, data: bytes) -> None:
        if isinstance(data, str):
            data = data.encode()
        with self.connect() as con:
            con.execute("INSERT INTO artifacts VALUES (?, ?, ?, ?)", [run_id, kind, name, data])

    def _insert_rows(self, table, columns, run_id, rows, *, con=None) -> int:
        rows = list(rows)
        if not rows:
            return 0
        cols = list(zip(*rows))
        return self._insert(table, ["run_id"] + columns, run_id, {c: cols[i] for i, c in enumerate(columns)}, con=con)

    def _insert(self, table, columns, run_id, cols: dict, *, con=None) -> int:
        names = [c for c in columns[1:] if c in cols or c not in ADDED_EVENT_COLUMNS]     # absent: the default
        columns = ["run_id", *names]
        n = len(cols[names[0]])
        if n == 0:
            return 0
        frame = {}
        select = ["$run_id"]        # one parameter, not a column of n copies of the same text to scan
        params = {"run_id": run_id}
        for c in names:
            arr, mask = _masked_column(c, cols[c])
            same = _constant_text(arr)
            if same is not None:      # one text for every row (a backend, a phase): a parameter, not a column to scan
                if same[0] is None:
                    select.append("NULL")
                else:
                    params[f"_v_{c}"] = same[0]
                    select.append(f"$_v_{c}")
                continue
            frame[c] = arr
            if mask is None or not mask.any():
                select.append(c)
            else:
                # NULLs travel as a bool column beside the values: plain arrays scan fast everywhere
                # (masked and object arrays once failed in processes that imported torch)
                frame[f"_null_{c}"] = mask
                select.append(f"CASE WHEN _null_{c} THEN NULL ELSE {c} END")
        view = f"_batch_{table}_{threading.get_ident()}"
        sql = f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(select)} FROM {view}"
        if not frame:                 # every column constant: one row per event all the same
            frame["_row"] = np.zeros(n, dtype=np.int8)
        if con is not None:
            _scan(con, view, frame, sql, params)
        else:
            with self.connect() as c:
                _scan(c, view, frame, sql, params)
        return n

    # --- reading -------------------------------------------------------------------------
    def _columns(self, table, run_id, columns, where="", params=(), order="") -> dict[str, np.ndarray]:
        with self.connect(read_only=True) as con:
            rid = self.get_run(run_id, con=con)["run_id"]
            sql = f"SELECT {', '.join(_selectable(con, table, columns))} FROM {table} WHERE run_id = ? {where} {order}"
            out = con.execute(sql, [rid, *params]).fetchnumpy()
        return {k: _unmask(v) for k, v in out.items()}

    def events_frame(self, run_id, columns=None, t0=None, t1=None, step=None) -> dict[str, np.ndarray]:
        cols = list(columns or EVENT_COLUMNS[1:])
        where, params = [], []
        if t0 is not None:
            where.append("end_ns >= ?")
            params.append(int(t0))
        if t1 is not None:
            where.append("start_ns <= ?")
            params.append(int(t1))
        if step is not None:
            where.append("step = ?")
            params.append(int(step))
        clause = "".join(f" AND {w}" for w in where)
        return self._columns("events", run_id, cols, clause, params, "ORDER BY step, start_ns, seq")

    def memory_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._columns("memory", run_id, MEMORY_COLUMNS, order="ORDER BY t_ns, step, seq")

    def tensors_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._columns("tensors", run_id, TENSOR_COLUMNS, order="ORDER BY step, seq, slot")

    def hardware_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._columns("hardware", run_id, HARDWARE_COLUMNS, order="ORDER BY t_ns")

    def stacks_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._columns("stacks", run_id, STACK_COLUMNS, order="ORDER BY thread, t_ns, depth")

    def artifacts(self, run_id, kind=None) -> list[tuple[str, str, bytes]]:
        rid = self.get_run(run_id)["run_id"]
        with self.connect(read_only=True) as con:
            if kind is None:
                rows = con.execute("SELECT kind, name, data FROM artifacts WHERE run_id = ?", [rid]).fetchall()
            else:
                rows = con.execute("SELECT kind, name, data FROM artifacts WHERE run_id = ? AND kind = ?",
                                   [rid, kind]).fetchall()
        return [(k, n, bytes(d) if d is not None else b"") for k, n, d in rows]

    def op_stats(self, run_id, by: str = "op", step=None) -> list[dict]:
        from . import stats
        with self.connect(read_only=True) as con:   # one connection: opening the file costs more than a cached table
            rid = self.get_run(run_id, con=con)["run_id"]
            try:
                return stats.op_stats(con, rid, by=by, step=step)
            except duckdb.InvalidInputException as e:
                if "read-only" not in str(e):
                    raise
        # a finished run not cached for this grouping yet: cache it where the store can be written
        try:
            with self.connect() as con:
                return stats.op_stats(con, rid, by=by, step=step)
        except StoreError:
            pass
        with self.connect(read_only=True) as con:     # a read-only or full disk: aggregate without keeping it
            # NOTE: stats has no "don't cache" switch yet; its live query is what op_stats runs uncached
            return [stats._dict(r) for r in con.execute(stats._live_sql(con, rid, by, "") + stats._ORDER,
                                                         {"run": rid}).fetchall()]

    # --- what an imported trace holds besides ops (schema.IMPORT_TABLES) --------------------
    def add_spans(self, run_id: str, cols: dict, *, con=None) -> int:
        """Annotations, runtime calls and other spans that are not ops: columns keyed by SPAN_COLUMNS."""
        return self._insert("spans", ["run_id", *SPAN_COLUMNS], run_id, cols, con=con)

    def add_flows(self, run_id: str, cols: dict, *, con=None) -> int:
        return self._insert("flows", ["run_id", *FLOW_COLUMNS], run_id, cols, con=con)

    def add_kernel_args(self, run_id: str, cols: dict, *, con=None) -> int:
        return self._insert("kernel_args", ["run_id", *KERNEL_ARG_COLUMNS], run_id, cols, con=con)

    def spans_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._import_frame("spans", run_id, SPAN_COLUMNS, "ORDER BY backend, device, thread, start_ns, depth")

    def flows_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._import_frame("flows", run_id, FLOW_COLUMNS, "ORDER BY from_ns, to_ns")

    def kernel_args_frame(self, run_id) -> dict[str, np.ndarray]:
        return self._import_frame("kernel_args", run_id, KERNEL_ARG_COLUMNS, "ORDER BY step, seq")

    def _import_frame(self, table, run_id, columns, order) -> dict[str, np.ndarray]:
        try:
            return self._columns(table, run_id, columns, order=order)
        except duckdb.CatalogException:     # a store from before the table, read where it cannot be upgraded
            self.get_run(run_id)
            return {c: np.zeros(0, dtype=object) for c in columns}


def _scan(con, view, frame, sql, params=None):
    con.register(view, frame)
    try:
        con.execute(sql, params)
    finally:
        con.unregister(view)


def _as_seen(run: dict) -> dict:
    """A run still 'running' whose collecting process is gone (killed with SIGKILL, the machine
    rebooted) can never finish: it reads as failed, with every event that arrived. The next writer
    to open the store records that (`_mark_dead_runs_failed`); a reader never writes."""
    error = _dead_collector(run)
    return run if error is None else {**run, "status": "failed", "error": error}


def _dead_collector(run: dict) -> str | None:
    if run.get("status") != "running":
        return None
    cfg = run.get("config")          # _run_dict parsed it; a string here is not JSON
    who = (cfg.get("collector") if isinstance(cfg, dict) else None) or {}
    try:
        pid = int(who.get("pid") or 0)
    except (TypeError, ValueError):
        return None
    if who.get("host") != socket.gethostname() or pid <= 0 or _alive(pid):
        return None
    return (f"the process that collected this run (pid {pid}) ended without closing it; "
            "the events that arrived are kept")


def _mark_dead_runs_failed(con) -> None:
    running = con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE status = 'running'").fetchall()
    for run in map(_run_dict, running):
        error = _dead_collector(run)
        if error is not None:
            con.execute(f"UPDATE runs SET status = 'failed', error = $error, ended_at = $t, events = ({_STORED}) "
                        "WHERE run_id = $run AND status = 'running'", {"error": error, "t": time.time(),
                                                                        "run": run["run_id"]})


# runs.events when a run ends: the rows stored, counted (used as `events = (_STORED)` with $run bound)
_STORED = "SELECT count(*) FROM events WHERE events.run_id = $run"


@contextlib.contextmanager
def counted(con):
    """Rows and the runs.events that counts them in one transaction: both are stored or neither. (Each in its
    own, a full disk between the two left 10,495 rows stored under a count of 9,220.) Inside a transaction
    the caller opened, that one holds them together."""
    try:
        con.execute("BEGIN TRANSACTION")
    except duckdb.TransactionException:      # already in the caller's
        yield con
        return
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):     # a failed COMMIT has rolled back already
            con.execute("ROLLBACK")
        raise


def _empty_store():
    """An absent store, read: the tables, empty, in memory (reading creates nothing on disk)."""
    con = duckdb.connect(":memory:")
    for stmt in DDL:
        con.execute(stmt)
    con.execute(CACHE_DDL)
    return con


def _selectable(con, table: str, columns: list[str]) -> list[str]:
    """Columns to SELECT: one a store written by an older opscope lacks (and a reader cannot add) reads
    as its default."""
    if table != "events" or not set(columns) & set(ADDED_EVENT_COLUMNS):
        return list(columns)
    have = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'events'")
            .fetchall()}
    return [c if c in have or c not in ADDED_EVENT_COLUMNS else f"{ADDED_EVENT_COLUMNS[c][1]} AS {c}"
            for c in columns]


# what the disk said -> (what to tell the user, exit code); matched on errno, else on DuckDB's message
_FAULTS = [
    (errno.ENOSPC, "no space left on device", "no space left on device; free some, or set {env} to a folder on "
                                              "another disk", 1),
    (errno.EDQUOT, "disk quota exceeded", "disk quota exceeded; free some, or set {env} to another folder", 1),
    (errno.EFBIG, "file too large", "the file is too large for this system's limit (ulimit -f); set {env} to "
                                    "another folder", 1),
    (errno.EROFS, "read-only file system", "read-only file system; set {env} to a writable folder", 2),
    (errno.EACCES, "permission denied", "permission denied; set {env} to a writable folder", 2),
    (errno.EPERM, "operation not permitted", "operation not permitted; set {env} to a writable folder", 2),
]


@contextlib.contextmanager
def _store_errors(store: RunStore, writing: bool):
    """Disk faults, a damaged file, a file where the folder should be -> one StoreError line."""
    try:
        yield
    except StoreError:
        raise
    except (RuntimeError, duckdb.InterruptException) as e:
        # Ctrl-C while DuckDB runs a query: it checks for the signal itself and raises RuntimeError("Query
        # interrupted") (InterruptException in some versions), never KeyboardInterrupt, so the command
        # reported "error: RuntimeError" and exit 1. It is the user's Ctrl-C: raise it as one, so every
        # caller's Ctrl-C path runs (runs kept as interrupted, one line, exit 130).
        if isinstance(e, duckdb.InterruptException) or first_line(e).strip() == "Query interrupted":
            raise KeyboardInterrupt from None
        raise
    except (OSError, duckdb.Error) as e:
        err = _store_error(store, e, writing)
        if err is None:
            raise
        raise err from None


def _store_error(store: RunStore, e: BaseException, writing: bool) -> StoreError | None:
    path, text = store.path, str(e)
    low = text.lower()
    code = getattr(e, "errno", None)
    for num, words, advice, exit_code in _FAULTS:
        if code == num or words in low:
            verb = "write" if writing or exit_code == 1 else "read"
            return StoreError(f"cannot {verb} the run store at {path}: {advice.format(env=HOME_ENV)}", exit_code)
    if isinstance(e, (NotADirectoryError, FileExistsError)) or "not a directory" in low:
        return StoreError(_not_a_folder(store))
    if "is a directory" in low:
        return StoreError(f"the run store at {path} is a folder: move it away, or set {HOME_ENV} to another folder")
    if any(w in low for w in _UNREADABLE):
        if any(w in low for w in _DAMAGE):
            store.note_damage(first_line(e))
        return StoreError(_damaged(store, first_line(e)), damaged=True)
    if "disabled by configuration" in low or "but it exists in the" in low:
        # a view or default in the file that wants another file, the network or an extension: not our store
        return StoreError(f"the run store at {path} asks for more than its own tables ({first_line(e)[:200]}); "
                          f"opscope reads stores with files, network and extensions off: it is not a store opscope "
                          f"wrote; move it away, or set {HOME_ENV} to another folder")
    if "conflicting lock" in low or "could not set lock" in low:
        return StoreError(f"the run store at {path} is held by another process ({first_line(e)}); "
                          "try again when it is done", 1)
    if "invalidated" in low or isinstance(e, duckdb.FatalException):
        return StoreError(f"the run store at {path} failed to write earlier in this process ({first_line(e)}); "
                          f"check the disk and run again", 1)
    if isinstance(e, (OSError, duckdb.IOException)):
        why = (f"{e.strerror} ({e.filename})" if e.filename else e.strerror) if isinstance(e, OSError) and \
            e.strerror else first_line(e)
        return StoreError(f"cannot {'write' if writing else 'read'} the run store at {path}: {why}; "
                          f"set {HOME_ENV} to a writable folder")
    return None


def _damaged(store: RunStore, why: str) -> str:
    return (f"the run store at {store.path} is not a run store opscope can read (damaged, or another file: {why[:200]}); "
            f"opscope will not write into it: `opscope runs` lists the runs it still reads; move it away, "
            f"or set {HOME_ENV} to another folder")


def _take_lock(store: RunStore, exclusive: bool) -> int | None:
    """flock on `<store>.lock`, taken before DuckDB opens the store (the module docstring says why); the
    fd to give back to _release_lock. Waits up to _LOCK_WAIT_S, then one line naming who holds it.

    Writers go first: a writer holds `<store>.turn` while it waits, and a reader passes through it
    before taking its shared lock. Without it, readers' shared locks (a served dashboard polling, `runs`,
    a monitor) overlapped back to back and a writer under load waited the whole bound for a gap."""
    if fcntl is None or str(store.path) == ":memory:":
        return None
    fd = _open_lock(f"{store.path}.lock", exclusive)
    if fd is None:
        return None                # a read-only home without a lock file: nobody can be writing it
    deadline = time.monotonic() + _LOCK_WAIT_S
    turn = _open_lock(f"{store.path}.turn", exclusive)
    try:
        got = turn is None or _flock_until(turn, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline)
        got = got and _flock_until(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline)
    except BaseException:
        os.close(fd)
        raise
    finally:
        if turn is not None:
            os.close(turn)         # the turnstile is only for the wait
    if not got:
        holder = _lock_holder(fd)
        os.close(fd)
        raise StoreError(f"the run store at {store.path} has been held by another process{holder} for "
                         f"over {_LOCK_WAIT_S:g} s; try again when it is done", 1) from None
    if exclusive:                  # who holds it, for the message another writer may have to print
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _open_lock(path: str, exclusive: bool) -> int | None:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        if exclusive:
            raise                  # the store cannot be written either: _store_errors says why, in one line
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None


def _flock_until(fd: int, mode: int, deadline: float) -> bool:
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(delay * (0.5 + random.random()))    # jitter: two waiters do not stay in step
            delay = min(delay * 2, 0.05)


def _lock_holder(fd: int) -> str:
    # the holder truncates the file before it writes its pid: an empty file names nobody
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(os.pread(fd, 32, 0).split()[0])
        return f" (pid {pid})"
    return ""


def _release_lock(fd: int, exclusive: bool) -> None:
    if exclusive:                  # no stale pid for a reader's wait to name
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
    os.close(fd)                   # closing the only descriptor of an flock releases it


def _not_a_folder(store: RunStore) -> str:
    where = f"{HOME_ENV}={store.path.parent}" if store._home else f"the run store folder {store.path.parent}"
    return f"cannot use {where}: it (or a folder above it) is a file, not a folder; set {HOME_ENV} to a folder"


def _run_dict(row) -> dict:
    d = dict(zip(RUN_COLUMNS, row))
    for k in ("versions", "config", "description"):
        if d.get(k):
            try:
                d[k] = json.loads(d[k])
            except ValueError:
                pass
    return d



def _unmask(v) -> np.ndarray:
    """NULL reads back as None (text), NaN (floats: a missing gpu_util is not 0 %), or 0 (integers:
    counts and sizes that were not recorded)."""
    if not isinstance(v, np.ma.MaskedArray):
        return np.asarray(v)
    if v.dtype == object:
        out = v.data.copy()                 # NOTE: filled(None) means "the default fill" ('?'), not None
        out[np.ma.getmaskarray(v)] = None
        return out
    if v.dtype.kind == "f":
        return v.filled(np.nan)
    return v.filled(0)


def run_description(run: dict) -> dict:
    """The backend description a run was recorded with, as a dict ({} when it has none)."""
    d = run.get("description")
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            d = None
    return d if isinstance(d, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # someone else's process: alive
        return True
    return True
