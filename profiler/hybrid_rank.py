"""One rank of `opscope train --hybrid` as the tools run it: the runtime's rank (runtime/dist/worker.py) whose
records also go to --shared-dir (profiler/shared.py's layout) as event columns, so `opscope serve DIR` and
`opscope trace import DIR` read every rank where it lies.

    python -m opscope.profiler.hybrid_rank     # what app/hybrid.py's launcher starts per rank (torchrun's variables)
"""
from __future__ import annotations

import os
import sys

from opscope.runtime.dist.cli_support import summarize
from opscope.runtime.errors import OpscopeError, first_line

from .schema import EVENT_COLUMNS


def span_events(rec: dict) -> dict:
    """A step record's spans (forward_backward, all_reduce, optimizer, all_gather) as event columns
    with the rank and world size, on the run's aligned clock: a coarse multi-rank timeline that
    profiler/ranks.py breaks down (per-op events per rank need the recorder: see runtime/dist README)."""
    spans = rec.get("spans") or []
    n = len(spans)
    cols = {c: [None] * n for c in EVENT_COLUMNS[1:]}
    phase = {"forward_backward": "backward", "optimizer": "optimizer"}
    cols.update(step=[rec["step"]] * n, seq=list(range(n)), op=[s[0] for s in spans],
                node=[f"{s[0]}_{rec['step']}" for s in spans], module=[""] * n, source=[""] * n,
                backend=[rec["backend"]] * n, device=[rec["backend"]] * n, thread=[0] * n, depth=[0] * n,
                start_ns=[s[1] for s in spans], end_ns=[s[2] for s in spans], bytes=[0] * n, flops=[0] * n,
                fallback=[False] * n, live_bytes=[0] * n, phase=[phase.get(s[0], "communication") for s in spans],
                fwd_node=[""] * n, rank=[rec["rank"]] * n, world_size=[rec["world_size"]] * n)
    for c in ("input_shapes", "input_dtypes", "output_shapes", "output_dtypes"):
        cols[c] = [""] * n
    return cols


class SharedRank:
    """--shared-dir: this rank's steps, status and (rank 0) the job's report, written where every node can
    read them (profiler/shared.py owns the layout). Without --shared-dir it only keeps the records
    (runtime/dist/job.py Records)."""

    def __init__(self, job, start: dict):
        self.job, self.start, self.records, self.writer = job, start, [start], None
        if not job.shared_dir:
            return
        from .shared import RankWriter, job_name      # DuckDB: only a rank that writes the shared folder loads it
        rank = start["rank"]
        self.writer = RankWriter(job.shared_dir, job_name(job.model, start["base"]), rank)
        run = None
        if rank == 0:
            run = {"model": job.model, "hybrid": job.hybrid, "backends": job.specs, "world_size": start["world_size"],
                   "steps": job.steps, "engine": start["engine"]}
        self.writer.begin(run, {"backend": start["backend"], "rows": start["rows"]})

    def keep(self, rec: dict) -> dict:
        self.records.append(rec)
        if self.writer is not None and rec.get("kind") == "step":
            self.writer.step(rec["step"], span_events(rec))
        return rec

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if self.writer is None:
            return False
        error = None
        if exc is not None:
            # a generator closed early (the launcher went away) is no error of the rank's, but it did not finish
            error = "stopped before the end" if kind is GeneratorExit else \
                (str(exc) if isinstance(exc, OpscopeError) else f"{kind.__name__}: {first_line(exc)}")
        status = "failed" if exc is not None else "ok"
        try:
            self.writer.end(status, error, report=summarize(self.job, self.records, error))
        except OSError:           # the shared folder went away: the training's own outcome matters more
            if exc is None:
                raise
        return False


def main() -> int:
    from opscope.runtime.dist.worker import main as rank
    return rank(SharedRank)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # as runtime/dist/worker.py: every record is out and the group destroyed; torch's and gloo's C++ threads can
    # still abort (SIGABRT) a finished rank during interpreter finalization
    os._exit(code)
