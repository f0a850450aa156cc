"""The run store: every profiled run, its events, memory, tensor summaries, hardware samples, stacks.

    store = RunStore()                                   # $OPSCOPE_HOME/runs.duckdb
    run_id = store.create_run(model="demo:gpt", backend="torch:cpu", device="cpu")
    store.add_events(run_id, rows)                       # tuples in EVENT_COLUMNS order, without run_id
    store.finish_run(run_id, status="ok")
    store.op_stats(run_id)                               # per-op aggregates, in SQL

DuckDB lets one process at a time open a database file read-write. A collector in one process
and the web server in another share the file by holding connections only for the work at hand
(open, do the work, close) and retrying when the other side holds the lock.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import socket
import threading
import time
import uuid
from pathlib import Path

import duckdb
import numpy as np

from opscope.runtime.errors import UsageError
from opscope.runtime.home import opscope_home

from .schema import DDL, EVENT_COLUMNS, SCHEMA_VERSION
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
        "free_bytes", "count", "nan", "inf", "mem_bytes", "gpu_mem_bytes", "dur_ns"}
_FLOAT = {"min", "max", "mean", "std", "hist_lo", "hist_hi", "cpu_percent", "gpu_util", "temperature_c", "power_w"}
_BOOL = {"fallback"}

_LOCK_WAIT_S = 30.0
_ready: set[str] = set()          # database files whose tables exist (checked once per process)
_ready_lock = threading.Lock()
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
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr, None


def versions() -> dict:
    import torch
    from importlib.metadata import PackageNotFoundError, version
    try:
        ours = version("opscope")
    except PackageNotFoundError:
        ours = "0+unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "duckdb": duckdb.__version__, "opscope": ours}


class RunStore:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else opscope_home() / "runs.duckdb"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = str(self.path.resolve())
        with _ready_lock:
            if key not in _ready:
                with self.connect() as con:
                    for stmt in DDL:
                        con.execute(stmt)
                    con.execute(CACHE_DDL)
                    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
                _ready.add(key)

    # --- connections ---------------------------------------------------------------------
    @contextlib.contextmanager
    def connect(self):
        """A short-lived connection; waits while another process holds the file's lock."""
        with _PROCESS_LOCK:
            with self._connect() as con:
                yield con

    @contextlib.contextmanager
    def _connect(self):
        deadline = time.monotonic() + _LOCK_WAIT_S
        delay = 0.005
        while True:
            try:
                con = duckdb.connect(str(self.path))
                break
            except duckdb.IOException as e:
                if "lock" not in str(e).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(delay * (0.5 + random.random()))   # jitter: two pollers do not stay in step
                delay = min(delay * 2, 0.04)
        try:
            yield con
        finally:
            con.close()

    def query(self, sql: str, params=()) -> list[tuple]:
        with self.connect() as con:
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
            con.execute("UPDATE runs SET status = ?, error = ?, dropped = greatest(dropped, ?), ended_at = ? WHERE run_id = ?",
                        [status, error, int(dropped), time.time(), run_id])
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
        with self.connect() as con:
            cur = con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY started_at DESC")
            runs = [_run_dict(r) for r in cur.fetchall()]
        return [self._reap(r) for r in runs]

    def _reap(self, run: dict) -> dict:
        """A run still 'running' whose collecting process is gone (killed with SIGKILL, the machine
        rebooted) can never finish: mark it failed, keeping every event that arrived."""
        if run.get("status") != "running":
            return run
        cfg = run.get("config")          # _run_dict parsed it; a string here is not JSON
        who = (cfg.get("collector") if isinstance(cfg, dict) else None) or {}
        if who.get("host") != socket.gethostname() or not who.get("pid") or _alive(int(who["pid"])):
            return run
        error = (f"the process that collected this run (pid {who['pid']}) ended without closing it; "
                 "the events that arrived are kept")
        self.finish_run(run["run_id"], "failed", error)
        return {**run, "status": "failed", "error": error}

    def get_run(self, run_id: str, *, con=None) -> dict:
        rid = (run_id or "").strip()
        if con is None:
            with self.connect() as c:
                return self.get_run(rid, con=c)
        rows = [] if not rid else con.execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE starts_with(run_id, ?) ORDER BY started_at DESC",
            [rid]).fetchall()
        exact = [r for r in rows if r[0] == rid]
        if exact:
            return self._reap(_run_dict(exact[0]))
        if not rows:
            raise UsageError(f"unknown run {rid!r}: `opscope runs` lists them")
        if len(rows) > 1:
            raise UsageError(f"run id {rid!r} is ambiguous ({len(rows)} runs start with it): give more characters")
        return self._reap(_run_dict(rows[0]))

    def delete_run(self, run_id: str) -> None:
        rid = self.get_run(run_id)["run_id"]
        with self.connect() as con:
            for t in ("events", "memory", "tensors", "hardware", "stacks", "artifacts", "op_stats_cache", "runs"):
                con.execute(f"DELETE FROM {t} WHERE run_id = ?", [rid])

    # --- writing -------------------------------------------------------------------------
    def add_events(self, run_id: str, rows) -> int:
        rows = list(rows)
        if not rows:
            return 0
        cols = list(zip(*rows))
        return self.add_event_columns(run_id, {c: cols[i] for i, c in enumerate(EVENT_COLUMNS[1:])})

    def add_event_columns(self, run_id: str, cols: dict, *, con=None) -> int:
        """The fast path: one batch as columns (numpy arrays or sequences), keyed by EVENT_COLUMNS names."""
        if con is None:
            with self.connect() as c:
                return self.add_event_columns(run_id, cols, con=c)
        n = self._insert("events", EVENT_COLUMNS, run_id, cols, con=con)
        if n:
            con.execute("UPDATE runs SET events = events + ? WHERE run_id = ?", [n, run_id])
        return n

    def add_memory(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("memory", MEMORY_COLUMNS, run_id, rows, con=con)

    def add_tensors(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("tensors", TENSOR_COLUMNS, run_id, rows, con=con)

    def add_hardware(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("hardware", HARDWARE_COLUMNS, run_id, rows, con=con)

    def add_stacks(self, run_id: str, rows, *, con=None) -> int:
        return self._insert_rows("stacks", STACK_COLUMNS, run_id, rows, con=con)

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
        names = columns[1:]
        n = len(cols[names[0]])
        if n == 0:
            return 0
        frame = {"run_id": np.full(n, run_id, dtype=object)}
        select = ["run_id"]
        for c in names:
            arr, mask = _masked_column(c, cols[c])
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
        if con is not None:
            _scan(con, view, frame, sql)
        else:
            with self.connect() as c:
                _scan(c, view, frame, sql)
        return n

    # --- reading -------------------------------------------------------------------------
    def _columns(self, table, run_id, columns, where="", params=(), order="") -> dict[str, np.ndarray]:
        rid = self.get_run(run_id)["run_id"]
        sql = f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = ? {where} {order}"
        with self.connect() as con:
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
        with self.connect() as con:
            if kind is None:
                rows = con.execute("SELECT kind, name, data FROM artifacts WHERE run_id = ?", [rid]).fetchall()
            else:
                rows = con.execute("SELECT kind, name, data FROM artifacts WHERE run_id = ? AND kind = ?",
                                   [rid, kind]).fetchall()
        return [(k, n, bytes(d) if d is not None else b"") for k, n, d in rows]

    def op_stats(self, run_id, by: str = "op", step=None) -> list[dict]:
        from .stats import op_stats
        with self.connect() as con:           # one connection: opening the file costs more than a cached table
            rid = self.get_run(run_id, con=con)["run_id"]
            return op_stats(con, rid, by=by, step=step)


def _scan(con, view, frame, sql):
    con.register(view, frame)
    try:
        con.execute(sql)
    finally:
        con.unregister(view)


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
        return v.filled(None)
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
