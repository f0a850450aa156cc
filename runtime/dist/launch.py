"""Start one process per share, the way torchrun would, and collect what every rank reports.

    result = launch(job)                    # DistJob from runtime/dist/job.py
    result.records                          # every record every rank sent, in arrival order
    result.error                            # None, or one line: which rank died and how the others stopped

Children are `python -m opscope.runtime.dist.worker` with torchrun's variables set (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the job in OPSCOPE_DIST_JOB; each prints its records as
JSON lines after a marker, so a model's own prints never pass for a record. When a rank dies, the
others fail their next collective (gloo notices the closed connection; the process-group timeout
covers a rank that hangs instead); whoever is still alive after that is killed. Nothing waits for ever.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from ..child import python_command, start
from ..errors import UsageError, signal_name
from .job import ENV_JOB, DistJob

MARK = "@opscope-dist "
GRACE_S = 10.0          # after a rank fails: how long the others get to notice before they are killed


@dataclass
class DistResult:
    records: list[dict] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    error: str | None = None
    hung: dict = field(default_factory=dict)       # rank -> its state when opscope had to kill it ("stopped", ...)

    def of(self, kind: str, rank: int | None = None) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind and (rank is None or r.get("rank") == rank)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emit(record: dict, stream=None) -> None:
    """A record from a rank to its launcher (one line; flushed so a rank that dies next keeps it)."""
    stream = stream or sys.stdout
    stream.write(MARK + json.dumps(record, default=float) + "\n")
    stream.flush()


def launch(job: DistJob, *, on_record=None, deadline_s: float | None = None,
           worker: str = "opscope.runtime.dist.worker") -> DistResult:
    """Run `job` in len(job.specs) processes; `on_record(record, procs)` sees each record as it arrives.
    `worker`: the rank's module (`-m`); the tools name theirs, which also writes --shared-dir."""
    if job.shared_dir and worker == "opscope.runtime.dist.worker":
        # the runtime's rank keeps its records in memory; the folder's writer is the tools' (never dropped silently)
        raise UsageError("--shared-dir is written by the tools' rank process: launch(job, worker="
                         "\"opscope.profiler.hybrid_rank\") (what `opscope train --hybrid` starts)")
    world = len(job.specs)
    port = free_port()
    base = {**os.environ, ENV_JOB: job.to_json(), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun's rule: each rank gets its share of the cores, not all of them (with the default every
        # rank starts a thread per core, and on a 2-core machine the job ran ~7x slower)
        base["OMP_NUM_THREADS"] = str(threads_per_rank(world))
    procs = [start(python_command(worker),
                   env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, start_new_session=True) for r in range(world)]
    result = DistResult(exit_codes=[None] * world, stderr=[""] * world)
    lock = threading.Lock()

    def read_out(r, p):
        for line in _lines(p.stdout):
            if line.startswith(MARK):
                try:
                    rec = json.loads(line[len(MARK):])
                except ValueError:
                    continue
                with lock:
                    result.records.append(rec)
                if on_record is not None:
                    on_record(rec, procs)

    def read_err(r, p):
        tail = []
        for line in p.stderr:
            tail = (tail + [line.rstrip()])[-40:]
        result.stderr[r] = "\n".join(tail)

    threads = [threading.Thread(target=f, args=(r, p), daemon=True) for r, p in enumerate(procs)
               for f in (read_out, read_err)]
    for t in threads:
        t.start()
    end = time.monotonic() + (deadline_s or job.timeout_s * (job.steps + 4) + 120)
    failed_at = None
    try:
        # NOTE: a list, not a generator: any() stopped at the first live rank, so a later rank's failure was
        # never polled (its returncode stayed None) and the job waited for its deadline
        while any([p.poll() is None for p in procs]):
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if (failed_at is not None and now - failed_at > GRACE_S) or now > end:
                break
            time.sleep(0.05)
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                result.hung[r] = _state(p.pid)
                _kill(p)
        for p in procs:
            p.wait(timeout=30)
        # every rank is dead, so each pipe ends: drain them whole (the last records say how the job
        # ended); the bound is for a grandchild that escaped the rank's session and holds a pipe open
        drained = time.monotonic() + 60
        for t in threads:
            t.join(timeout=max(0.1, drained - time.monotonic()))
    result.exit_codes = [p.returncode for p in procs]
    result.error = _diagnose(job, result, timed_out=time.monotonic() > end)
    return result


MAX_LINE = 64 << 20           # a rank's record line; a longer one is dropped, never held whole


def _lines(stream):
    """A rank's output lines, each at most MAX_LINE characters: what crosses a process is bounded before it is
    kept (a rank that prints without a newline would otherwise grow one string without end)."""
    while line := stream.readline(MAX_LINE):
        if len(line) < MAX_LINE or line.endswith("\n"):
            yield line
            continue
        while (rest := stream.readline(MAX_LINE)) and not rest.endswith("\n"):
            pass                  # the overlong line's remainder, dropped


def threads_per_rank(world: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, world))


def _state(pid: int) -> str:
    """What a rank was doing when it had to be killed: 'stopped' (SIGSTOP, a debugger) or 'running'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "running"
    return "stopped" if state in ("T", "t") else "running"


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)       # the child's own session: it and anything it started
    except (ProcessLookupError, PermissionError):
        pass


def _diagnose(job: DistJob, result: DistResult, timed_out: bool) -> str | None:
    """One line: the rank that failed first (a crash beats 'my peer went away'), and how the rest stopped."""
    codes = result.exit_codes
    if all(c == 0 for c in codes):
        return None
    errors = {r["rank"]: r for r in result.of("error")}
    steps = {}
    for r in result.of("step"):
        steps[r["rank"]] = max(steps.get(r["rank"], -1), r["step"])

    def what(rank):
        c = codes[rank]
        who = f"rank {rank} ({job.specs[rank]})"
        if rank in errors:
            return f"{who}: {errors[rank]['message']}"
        if rank in result.hung:        # opscope's own SIGKILL is not how it failed: it stopped answering
            how = "its process was stopped (SIGSTOP)" if result.hung[rank] == "stopped" else "it was still running"
            return (f"{who} hung after step {steps.get(rank, -1) + 1} of {job.steps}: it stopped answering "
                    f"({how}); opscope killed it")
        last = (result.stderr[rank].strip().splitlines() or ["no message"])[-1][:300]
        if c is not None and c < 0:
            return (f"{who} died ({signal_name(-c)}) after step {steps.get(rank, -1) + 1} of {job.steps}"
                    + (f" ({last})" if result.stderr[rank].strip() else ""))
        return f"{who} exited with code {c}: {last}"

    bad = [r for r, c in enumerate(codes) if c != 0]
    cause = [r for r in bad if not errors.get(r, {}).get("collective")] or bad
    first = what(cause[0])
    others = [r for r in bad if r != cause[0]]
    tail = f"; {len(others)} other rank(s) stopped: {what(others[0])}" if others else ""
    if timed_out:
        tail += f"; the job ran past its deadline and was stopped"
    return first + tail
