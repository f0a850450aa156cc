"""Trace import: a torch.profiler (Kineto) / Chrome trace or an ONNX Runtime profile -> a run.

    from opscope.profiler.importers import import_trace
    run_id = import_trace("trace.json")            # engine "import", source = the file
    run_id = import_trace("traces/")               # one torch.profiler trace per rank -> one multi-rank run
    run_id = import_trace("shared/")               # `train --hybrid --shared-dir` Parquet: profiler/shared.py

The run holds one event per operator in the file, nested by time per thread (so self time works),
and every view and analysis reads it like a profiled run.
"""
from __future__ import annotations

import contextlib
import gc
from pathlib import Path

from opscope.runtime.errors import UsageError

from . import extras, kineto, onnxruntime
from .common import read_trace, save
from .ranks import import_rank_folder
from ..kept import BIG, when_stored


def parse_trace(path, max_bytes: int | None = None):
    """-> (EventTable, run fields). Raises UsageError (one line) for anything it cannot read."""
    path = Path(path)
    doc = read_trace(path, max_bytes)
    src = str(path)
    if onnxruntime.is_onnxruntime(doc):
        return onnxruntime.parse(doc, src)
    if kineto.is_chrome(doc):
        table, run = kineto.parse(doc, src)
        if run["config"].get("format") == "kineto":      # what the store has no column for, for the export
            run["extras"] = extras.collect(doc["traceEvents"] if isinstance(doc, dict) else doc)
        return table, run
    got = type(doc).__name__ if not isinstance(doc, dict) else f"an object with keys {sorted(doc)[:5]}"
    raise UsageError(f"cannot import {path}: it is JSON but not a trace (got {got}; expected a Chrome/Kineto trace "
                     f"with 'traceEvents' or an ONNX Runtime profile list)")


def import_trace(path, store=None, max_bytes: int | None = None, progress=None) -> str:
    """Parse the whole file (every file, for a folder) first, then create the run: a bad file never leaves
    a partial run. progress(what): told each phase of a file ("reading and parsing", "saving N events")."""
    with _no_gc():
        if Path(path).is_dir():
            from ..shared import import_shared, is_shared
            if is_shared(path):           # per-rank Parquet from `--shared-dir`: the first job's run
                return import_shared(path, store, max_bytes)[0]
            return import_rank_folder(path, store, max_bytes)
        return _import(path, store, max_bytes, progress or (lambda what: None))


@contextlib.contextmanager
def _no_gc():
    """A trace is millions of small dicts, none of them in a cycle: without this the collector walks
    all of them again and again while they are built (more than half of the import's time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _import(path, store, max_bytes, tell) -> str:
    tell("reading and parsing")
    table, run = parse_trace(path, max_bytes)
    if store is None:
        from opscope.profiler.store import RunStore
        store = RunStore()
    source = str(Path(path).resolve())
    run["config"]["events"] = len(table)
    model = run["model"] if run["model"] != "import" else f"import:{Path(path).name}"
    tell(f"saving {len(table):,} events")
    run_id = save(store, table, model=model, backend=run["backend"], device=run["device"], source=source,
                  config=run["config"], steps=max(1, run["steps"]))
    if run.get("extras"):
        extras.keep(store, run_id, run["extras"])
    if len(table) >= BIG:
        tell("computing its op stats and times")
    # a big run's numbers, so no page visit computes over its events; the advisor's analyses in a detached
    # child, so the import returns as soon as it did before they were kept
    when_stored(store, run_id, analyses="background")
    return run_id
