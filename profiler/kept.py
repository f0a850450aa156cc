"""What a finished run's pages and commands compute over all its events, kept in the store once its events are final.

    times = kept(store, run, "run_times", lambda: stats.run_times(con, run_id))   # computed once, then read
    when_stored(store, run_id)        # a big run, as it is stored: its op stats, times and analyses computed now

A million-event run took 19-69 s for the Compare page and 47 s for the Advisor's first visit, computing the same
numbers on every visit (issue 38); a finished run's events never change, so each number is computed once and read
after. A running run's are computed afresh (its events grow). `when_stored` computes them while the run is stored
-- by `profile`, `trace import` -- for runs big enough that a visit would wait; a small run's are computed on the
first visit, in well under a second.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

KIND = "kept"                  # the artifacts kind
_VERSION = 1                   # NOTE: bump when what a kept computation returns changes
BIG = 100_000                  # events from which `when_stored` computes a run's numbers as it is stored


def key(run: dict) -> str | None:
    """What the kept numbers depend on: the events (their count, final once the run ended) and this code's
    version. None while the run is running."""
    if run.get("status") in (None, "running") or not run.get("ended_at"):
        return None
    return f"v{_VERSION}:{run.get('events')}:{run.get('ended_at')}"


def _read(store, run_id: str, name: str) -> bytes | None:
    """One kept answer's bytes (not every one of the run's: the timeline's spans are tens of MB)."""
    with store.connect(read_only=True) as con:
        try:
            row = con.execute("SELECT data FROM artifacts WHERE run_id = ? AND kind = ? AND name = ? LIMIT 1",
                              [run_id, KIND, name]).fetchone()
        except Exception:         # a store without the artifacts table yet (read-only, absent): nothing kept
            return None
    return bytes(row[0]) if row and row[0] is not None else None


def kept(store, run: dict, what: str, compute):
    """compute()'s JSON-able answer for this run, kept once the run is final; read back after."""
    k = key(run)
    if k is None:
        return compute()
    name = f"{what}|{k}"
    blob = _read(store, run["run_id"], name)
    if blob is not None:
        try:
            return json.loads(blob)
        except ValueError:                # damaged or edited: computed (not kept twice under one name)
            return compute()
    value = compute()
    text = json.dumps(value)
    if json.loads(text) == value:          # only what reads back equal is kept, so a read is never a change
        try:
            store.add_artifact(run["run_id"], KIND, name, text)
        except Exception:   # a store this process cannot write now (read-only, or asked inside a reader's
            pass            # connection, which DuckDB then opens read-only): computed again next time
    return value


def peek(store, run: dict, what: str):
    """What kept() reads back for this run, computing nothing: None while nothing is kept (or the run runs)."""
    k = key(run)
    blob = _read(store, run["run_id"], f"{what}|{k}") if k is not None else None
    try:
        return json.loads(blob) if blob is not None else None
    except ValueError:
        return None


def kept_bytes(store, run: dict, what: str, compute, read=bytes):
    """kept() for an answer that is bytes (arrays: the timeline's spans), kept in a file beside the store: tens of
    MB read back from a file in 0.1 s took 1.3-1.8 s out of a DuckDB BLOB. -> read(the bytes); a kept file that
    read() refuses (cut short, damaged, edited) is built again and kept anew, not an error on every visit."""
    k = key(run)
    if k is None:
        return read(compute())
    path = _file(store, run["run_id"], f"{what}|{k}")
    try:
        return read(path.read_bytes())
    except Exception:                     # absent (OSError), or not what read() takes: built again below
        pass
    value = compute()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(value)
        os.replace(tmp, path)             # a reader never sees half a file
    except OSError:                       # a store folder this process cannot write: built again next time
        pass
    return read(value)


def _file(store, run_id: str, name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
    return _folder(store, run_id) / f"{safe}.bin"


def _folder(store, run_id: str) -> Path:
    return Path(store.path).parent / "kept" / "".join(c for c in run_id if c.isalnum())


def forget(store, run_id: str) -> None:
    """Remove a run's kept files (store.delete_run): a deleted million-event run left tens of MB behind."""
    if any(c.isalnum() for c in run_id):       # never the folder of every run's (an id of no letters or digits)
        shutil.rmtree(_folder(store, run_id), ignore_errors=True)


# what else a big run keeps as it is stored, from layers above this one (the web app's timeline spans):
# functions (store, run_id) -> None, registered by the module that knows how to compute it
KEEPERS: list = []


def run_times(store, run: dict) -> dict:
    """stats.run_times, kept."""
    from . import stats

    def compute():
        with store.connect(read_only=True) as con:
            return stats.run_times(con, run["run_id"])
    return kept(store, run, "run_times", compute)


def when_stored(store, run_id: str, force: bool = False, analyses: str = "now") -> bool:
    """Compute what the pages read of a big run (op stats in every grouping, its times, the advisor's analyses)
    now, as it is stored, so no visit computes over its events. True when it did (the run is final and big,
    or `force`).

    analyses: "now", or "background" -- the advisor's analyses (most of the cost: minutes for a million
    events on a loaded machine) computed by a detached child after the command returns, so `trace import`
    and `profile` stay as quick as they were; a page visited before it is done computes them itself."""
    run = store.get_run(run_id)
    if key(run) is None or not (force or int(run.get("events") or 0) >= BIG):
        return False
    from . import stats
    from .compare import side
    with store.connect() as con:
        stats.cache(con, run["run_id"])
    run_times(store, run)
    side(store, run, "name")          # the Compare page's and `opscope compare`'s part of this run
    for keep in KEEPERS:
        keep(store, run["run_id"])
    if analyses == "background":
        _analyse_in_background(store, run["run_id"])
    else:
        from .advisor import run_analyses
        run_analyses(run["run_id"], store)
    return True


def _analyse_in_background(store, run_id: str) -> None:
    import subprocess

    from opscope.runtime.child import python_command, start
    try:
        start(python_command("opscope.profiler.kept", str(store.path), run_id), stdin=subprocess.DEVNULL,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:                   # no process to spare: the first visit computes them
        pass


def main(argv: list[str]) -> int:
    """`python -m opscope.profiler.kept STORE RUN`: the advisor's analyses of a stored run, kept."""
    from .advisor import run_analyses
    from .store import RunStore
    if len(argv) != 2:
        return 2
    try:
        run_analyses(argv[1], RunStore(argv[0]))
    except Exception:                 # detached: nobody to tell; the first visit computes them instead
        return 1
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
