"""Runs beyond one machine: each rank writes its events into a folder every node can reach, and one
import reads them where they lie (DuckDB over Parquet). The embedded store stays the default.

    w = RankWriter(shared_dir, job_name("demo:gpt", base), rank)   # inside every rank (runtime/dist/job.py)
    w.begin(run={...} if rank == 0 else None, rank_info={"backend": ..., "host": ..., "pid": ...})
    w.step(step, event_columns)                                  # when a step ends: one Parquet file
    w.end("ok" | "failed", error, report=...)                    # rank 0 adds the job's report
    run_ids = import_shared("shared/", store)                    # one run per job under the folder

The folder's layout lives here and nowhere else:

    DIR/<job>/run.json                  rank 0: model, hybrid, backends, world_size, steps, started; then report
    DIR/<job>/rank-<r>.json             each rank: backend, host, pid; then status ok | failed, error
    DIR/<job>/rank-<r>/step-<n>.parquet that rank's events of step n (EVENT_COLUMNS without run_id)

Every file is written under a temporary name and renamed into place (os.replace), so a reader never
sees half a file. <job> is the same on every rank without asking: the model's name and rank 0's clock
at the start barrier, which every rank already holds. A rank that dies leaves its rank-<r>.json at
"running": the import keeps every step written and marks the run incomplete, naming the rank.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from functools import lru_cache
from pathlib import Path

import duckdb

from opscope.runtime.errors import UsageError, first_line
from opscope.runtime.safe_read import MAX_NS, MAX_RANKS, MAX_STEPS, checked_int, read_json

from .schema import DDL

RUN_FILE = "run.json"
_NOT_OURS = "it is not a file of a shared run (`opscope train --hybrid ... --shared-dir` writes them)"
EVENT_BYTES = 256                      # what one event costs the import (its row in the store, DuckDB's buffers)
MAX_JSON_BYTES = 4 * 1024 ** 2         # run.json holds a report of every step; more than this is not ours
MAX_FILES = 200_000                    # Parquet files per import (one per rank and step)
_RANK_FILE = re.compile(r"^rank-(\d{1,6})\.json$")
_RANK_DIR = re.compile(r"^rank-(\d{1,6})$")
_STEP_FILE = re.compile(r"^step-(\d{1,9})\.parquet$")
# what DuckDB writes for each events column type: (Parquet physical type, converted type or None)
_PARQUET = {"INTEGER": ("INT32", "INT_32"), "BIGINT": ("INT64", "INT_64"), "VARCHAR": ("BYTE_ARRAY", "UTF8"),
            "BOOLEAN": ("BOOLEAN", None), "DOUBLE": ("DOUBLE", None)}


def job_name(model: str, base: int) -> str:
    """The job's folder name: the same on every rank (the model and rank 0's clock at the start)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._")[:48] or "job"
    return f"{safe}-{base & (2 ** 64 - 1):x}"


@lru_cache(maxsize=1)
def event_types() -> dict[str, str]:
    """The events table's columns (without run_id) and their SQL types, from the store's own DDL."""
    con = _scratch()
    try:
        rows = con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'events' "
                           "ORDER BY column_index").fetchall()
    finally:
        con.close()
    return {n: t for n, t in rows if n != "run_id"}


def _scratch():
    from .schema import MIGRATIONS
    con = duckdb.connect(":memory:")
    for stmt in [*DDL, *MIGRATIONS]:       # the events table as a store has it now, added columns too
        con.execute(stmt)
    return con


def _sql_text(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, default=float))
    os.replace(tmp, path)


# --- writing (every rank) -------------------------------------------------------------------------
class RankWriter:
    def __init__(self, shared_dir, job: str, rank: int):
        self.folder = Path(shared_dir) / job
        self.rank = rank
        self.steps_dir = self.folder / f"rank-{rank}"
        self.info: dict = {}

    def begin(self, run: dict | None, rank_info: dict) -> None:
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        if run is not None:
            self.run = {**run, "started": time.time(), "status": "running"}
            _write_json(self.folder / RUN_FILE, self.run)
        self.info = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), **rank_info,
                     "status": "running", "error": None}
        _write_json(self.folder / f"rank-{self.rank}.json", self.info)

    def step(self, step: int, cols: dict) -> Path:
        """This rank's events of one step as one Parquet file, typed like the events table."""
        from .store import RunStore
        path = self.steps_dir / f"step-{int(step)}.parquet"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        con = _scratch()
        try:
            # the store's own columnar insert (NULL masks, numpy columns) into an in-memory events table
            RunStore(":memory:").add_event_columns("", cols, con=con)
            names = ", ".join(event_types())
            con.execute(f"COPY (SELECT {names} FROM events) TO {_sql_text(tmp)} (FORMAT parquet)")
        finally:
            con.close()
        os.replace(tmp, path)
        return path

    def end(self, status: str, error: str | None = None, report: dict | None = None) -> None:
        self.info.update(status=status, error=error, ended=time.time())
        _write_json(self.folder / f"rank-{self.rank}.json", self.info)
        if report is not None and self.rank == 0 and hasattr(self, "run"):
            self.run.update(status=status, error=error, ended=time.time(), report=report)
            _write_json(self.folder / RUN_FILE, self.run)


# --- reading ----------------------------------------------------------------------------------------
def _is_job(folder: Path) -> bool:
    """run.json or a rank-<r>/ folder (rank-<r>.json alone is also how people name torch.profiler traces)."""
    try:
        return any(p.name == RUN_FILE or (_RANK_DIR.match(p.name) and p.is_dir()) for p in folder.iterdir())
    except OSError:
        return False


def job_folders(folder) -> list[Path]:
    """The jobs a shared folder holds: the folder itself when it is one job, else each sub-folder that is."""
    folder = Path(folder)
    if _is_job(folder):
        return [folder]
    try:
        subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    return [p for p in subs if _is_job(p)]


def is_shared(path) -> bool:
    path = Path(path)
    return path.is_dir() and bool(job_folders(path))


def import_shared(folder, store=None, max_bytes: int | None = None) -> list[str]:
    """Every job under `folder` -> one run each (engine "dist"); returns their ids. Each job is checked
    whole before its run is created: a refused folder leaves the store as it was."""
    from .importers.common import max_bytes as limit_of
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"cannot import {folder}: no such folder")
    if not folder.is_dir():
        raise UsageError(f"cannot import {folder}: it is a file, not a shared run folder")
    jobs = job_folders(folder)
    if not jobs:
        raise UsageError(f"cannot import {folder}: no job in it (expected <job>/{RUN_FILE} and "
                         f"<job>/rank-<r>/step-<n>.parquet, as `opscope train --hybrid ... --shared-dir` writes)")
    limit = limit_of(max_bytes)
    plans = [_plan(job, limit) for job in jobs]          # every job checked before any run is made
    if store is None:
        from .store import RunStore
        store = RunStore()
    return [_save(store, plan) for plan in plans]


def _read_object(path: Path) -> dict:
    # the bounded reader: a regular file, its size checked before reading, nesting bounded (a run.json nested
    # 100,000 deep is one line, not a RecursionError)
    doc = read_json(path, MAX_JSON_BYTES, f"cannot import {path.parent}: {path.name}", _NOT_OURS)
    if not isinstance(doc, dict):
        raise UsageError(f"cannot import {path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _plan(job: Path, limit: int) -> dict:
    """What one job folder holds, checked: its run.json, each rank's status and Parquet files."""
    run = _read_object(job / RUN_FILE) if (job / RUN_FILE).exists() else {}
    ranks: dict[int, dict] = {}
    files: list[tuple[int, int, Path]] = []
    size = 0
    for p in sorted(job.iterdir()):
        m_file, m_dir = _RANK_FILE.match(p.name), _RANK_DIR.match(p.name)
        if m_file:
            ranks.setdefault(int(m_file.group(1)), {}).update(_read_object(p), seen=True)
        elif m_dir and p.is_dir():
            r = int(m_dir.group(1))
            ranks.setdefault(r, {})
            for f in p.iterdir():
                m = _STEP_FILE.match(f.name)
                if not m:
                    continue          # a temporary name being written, or something that is not ours
                if not f.is_file():
                    raise UsageError(f"cannot import {job}: {f} is not a file")
                files.append((r, int(m.group(1)), f))
                size += f.stat().st_size
                if len(files) > MAX_FILES:
                    raise UsageError(f"cannot import {job}: more than {MAX_FILES} step files")
                if size > limit:
                    raise UsageError(f"cannot import {job}: its step files are over the import limit of {limit} "
                                     "bytes; raise it with --max-bytes or OPSCOPE_IMPORT_MAX_BYTES")
    where = f"cannot import {job}: {RUN_FILE}"
    # numbers that reach SQL and arithmetic, range-checked first ("steps": 1e30 was a DuckDB INT32 error)
    world = run.get("world_size")
    if world is not None:
        checked_int(world, where, "world_size", 1, MAX_RANKS, _NOT_OURS)
    if run.get("steps") is not None:
        checked_int(run["steps"], where, "steps", 1, MAX_STEPS, _NOT_OURS)
    started = run.get("started")
    if started is not None and not (isinstance(started, (int, float)) and not isinstance(started, bool)
                                    and 0 <= started < 2 ** 40):
        raise UsageError(f"{where} has started = {str(started)[:40]}, expected seconds since 1970; {_NOT_OURS}")
    world = world or (max(ranks) + 1 if ranks else 0)
    if not files:
        raise UsageError(f"cannot import {job}: no step files (rank-<r>/step-<n>.parquet) in it")
    if max(ranks) >= world:
        raise UsageError(f"cannot import {job}: rank {max(ranks)} is beyond its world_size {world}")
    files.sort()
    _check_files(job, [f for _, _, f in files], limit)
    return {"job": job, "run": run, "ranks": ranks, "world": world, "files": files}


def _check_files(job: Path, files: list[Path], limit: int) -> None:
    """Every file has exactly the events columns, with their types, and the rows its footer declares fit the
    import limit -- all read from the footers, before any row is; or one line naming the file."""
    want = event_types()
    con = duckdb.connect(":memory:")
    try:
        try:
            names = [str(f) for f in files]
            rows = con.execute("SELECT file_name, name, type, converted_type, num_children FROM parquet_schema(?)",
                               [names]).fetchall()
            # every row group's rows, as the reader will read them (a 50 KB file may hold 10,000,000 rows)
            counts = con.execute("SELECT file_name, sum(n) FROM (SELECT DISTINCT file_name, row_group_id, "
                                 "row_group_num_rows AS n FROM parquet_metadata(?)) GROUP BY file_name",
                                 [names]).fetchall()
        except duckdb.Error as e:
            raise UsageError(f"cannot import {job}: {_unreadable(con, files, e)}") from None
    finally:
        con.close()
    total, most = 0, max(1, limit // EVENT_BYTES)
    for file, n in counts:
        total += int(n or 0)
        if total > most:
            raise UsageError(f"cannot import {job}: its step files declare more than {most} events (at {file}), "
                             f"over the import limit of {limit} bytes at {EVENT_BYTES} bytes an event; raise it "
                             "with --max-bytes or OPSCOPE_IMPORT_MAX_BYTES")
    schemas: dict[str, dict] = {str(f): {} for f in files}
    roots: set[str] = set()
    for file, name, kind, converted, _children in rows:
        if file not in roots:             # each file's first row is its schema's root, not a column
            roots.add(file)
            continue
        schemas[file][name] = (kind, converted)
    for file, cols in schemas.items():
        missing = [c for c in want if c not in cols]
        extra = [c for c in cols if c not in want]
        if missing or extra:
            what = (f"lacks column(s) {', '.join(missing)}" if missing else "") + \
                   ("; " if missing and extra else "") + (f"has unknown column(s) {', '.join(extra)}" if extra else "")
            raise UsageError(f"cannot import {job}: {file} {what}; it is not a step file opscope wrote")
        for c, t in want.items():
            physical, converted = _PARQUET.get(t, (None, None))
            got = cols[c]
            if got[0] != physical or (t == "VARCHAR" and got[1] != converted):
                raise UsageError(f"cannot import {job}: {file} column {c} is {got[0]}"
                                 f"{'/' + got[1] if got[1] else ''}, expected {t}")


def _unreadable(con, files: list[Path], e: Exception) -> str:
    """Which file DuckDB could not read, and why, in one line."""
    for f in files:
        try:
            con.execute("SELECT count(*) FROM parquet_schema(?)", [str(f)]).fetchall()
        except duckdb.Error as one:
            return f"{f} is not a readable Parquet file ({first_line(one)})"
    return f"its step files cannot be read ({first_line(e)})"


def _check_times(con, job: Path, run_id: str) -> None:
    """Every event's times lie within +-2**62 ns and end >= start, so any end - start, and any span across
    events, fits INT64 (start INT64 max, end -INT64 max imported as ok, then broke show and compare)."""
    bad = con.execute(f"SELECT rank, step, seq, start_ns, end_ns FROM events WHERE run_id = ? AND NOT "
                      f"coalesce(start_ns > -{MAX_NS} AND end_ns < {MAX_NS} AND end_ns >= start_ns, false) LIMIT 1",
                      [run_id]).fetchall()
    if bad:
        r, step, seq, start, end = bad[0]
        raise UsageError(f"cannot import {job}: rank {r} step {step} event {seq} has start {start} and end {end} "
                         f"(ns), outside -2**62 < start <= end < 2**62; it is not a step file opscope wrote")


def _status(plan: dict) -> tuple[str, str | None]:
    """ok when every rank said ok; incomplete when one never finished (died, or never started); failed
    when all finished and one failed. The error names the ranks."""
    ranks, world, run = plan["ranks"], plan["world"], plan["run"]
    steps = {}
    for r, n, _ in plan["files"]:
        steps[r] = max(steps.get(r, -1), n)
    unfinished, failed = [], []
    for r in range(world):
        info = ranks.get(r, {})
        who = f"rank {r}" + (f" ({info['backend']})" if isinstance(info.get("backend"), str) else "")
        if not info.get("seen"):
            unfinished.append(f"{who} wrote no rank-{r}.json")
        elif info.get("status") == "failed":
            failed.append(f"{who} failed: {str(info.get('error') or 'no message')[:300]}")
        elif info.get("status") != "ok":
            unfinished.append(f"{who} never finished (last step written: {steps.get(r, -1) + 1})")
    if not run:
        unfinished.insert(0, f"rank 0 wrote no {RUN_FILE}")
    if unfinished:
        return "incomplete", "; ".join(unfinished + failed)
    if failed:
        return "failed", "; ".join(failed)
    return "ok", None


def _save(store, plan: dict) -> str:
    from .importers.common import remove_run
    run, job, world = plan["run"], plan["job"], plan["world"]
    status, error = _status(plan)
    report = run.get("report") if isinstance(run.get("report"), dict) else None
    hybrid = str(run.get("hybrid") or "")
    ranks = [{"rank": r, **{k: v for k, v in info.items() if k != "seen"}} for r, info in sorted(plan["ranks"].items())]
    steps = len({n for _, n, _ in plan["files"]})
    config = {"format": "opscope-shared", "folder": str(job.resolve()), "world_size": world, "hybrid": hybrid,
              "backends": run.get("backends"), "clock": run.get("clock") if isinstance(run.get("clock"), str) else
              "aligned (rank 0's clock at the start barrier)",
              "ranks": ranks, "dist": report, "steps_written": steps}
    model = str(run.get("model") or f"shared:{job.name}")
    requested = run.get("steps") if isinstance(run.get("steps"), int) and run.get("steps") > 0 else steps
    backend = run.get("backend") if isinstance(run.get("backend"), str) else f"hybrid:{hybrid}"
    run_id = store.create_run(model=model, backend=backend, engine="dist", steps=requested,
                              config=config, source=str(job.resolve()))
    try:
        types = event_types()
        select = ", ".join(f"CAST({c} AS {t})" for c, t in types.items())
        with store.connect() as con:
            n = con.execute(f"INSERT INTO events (run_id, {', '.join(types)}) SELECT $run_id, {select} "
                            f"FROM read_parquet($files)",
                            {"run_id": run_id, "files": [str(f) for _, _, f in plan["files"]]}).fetchall()[0][0]
            _check_times(con, job, run_id)
            started = run.get("started")
            con.execute("UPDATE runs SET events = ?, started_at = coalesce(?, started_at) WHERE run_id = ?",
                        [int(n), float(started) if isinstance(started, (int, float)) else None, run_id])
        store.finish_run(run_id, status, error)
    except duckdb.Error as e:
        remove_run(store, run_id)
        raise UsageError(f"cannot import {job}: its step files cannot be read ({first_line(e)})") from None
    except BaseException:
        remove_run(store, run_id)
        raise
    return run_id
