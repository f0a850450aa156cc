"""A few ranks of one module on this host that each answer once: the link benchmark's all-reducing processes and
the shares timed together (launch.py runs the jobs themselves, with their stream of records).

    answers = run_local_ranks("opscope.runtime.dist.linkbench", 2, env, MARK, what="the link benchmark",
                              timeout_s=120, answering=[0])       # [rank 0's JSON answer, None]

Each rank is `python -m MODULE` with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) in its own
session, as launch.py starts the job's ranks: where the kernel groups tasks by session to share the CPU (Linux's
autogroup), N ranks in one session get one session's share of a busy host, not N. A rank answers with one line,
MARK + JSON; nothing else it prints is kept (a model's factory may print), its stderr only as its last lines for
the message. What is read is bounded (an answer of at most MAX_ANSWER bytes, lines cut at MAX_ERR_LINE) and is JSON,
never a pickle. A rank that fails ends the others after GRACE_S (a peer waiting in a collective for it would wait
for gloo's timeout), and none runs past `timeout_s`.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from ..child import python_command, start
from ..errors import ModelError, first_line

MAX_ANSWER = 8 << 20        # a share's answer (its runs and its model's shape) is a few KB; a link fit less
MAX_ERR_LINE = 1000
ERR_LINES = 40
GRACE_S = 10.0
_TOO_LONG = object()       # an answer line past MAX_ANSWER


def run_local_ranks(module: str, world: int, env: dict, mark: str, *, what: str, timeout_s: float,
                    answering=None) -> list:
    """Each rank's parsed answer (None for a rank outside `answering`, default every rank), or one ModelError
    line: `what` failed (the failing rank's last stderr line), or did not finish in `timeout_s`."""
    from .launch import _kill, free_port
    answering = range(world) if answering is None else answering
    base = {**env, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [start(python_command(module), env={**base, "RANK": str(r)}, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, start_new_session=True) for r in range(world)]
    answers: list = [None] * world
    errors: list[list[str]] = [[] for _ in range(world)]
    readers = [threading.Thread(target=f, args=(p, r), daemon=True) for r, p in enumerate(procs)
               for f in (lambda p, r: _read_answer(p.stdout, mark.encode(), answers, r),
                         lambda p, r: _read_tail(p.stderr, errors[r]))]
    for t in readers:
        t.start()
    end, failed_at, timed_out = time.monotonic() + timeout_s, None, False
    try:
        while [p.poll() for p in procs].count(None):       # every one polled: any() would stop at the first alive
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if failed_at is not None and now - failed_at > GRACE_S:
                break
            if now > end:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        for p in procs:
            p.wait()
        for t in readers:          # every rank is dead, so its pipes end; the bound is for an escaped grandchild
            t.join(timeout=10)
    if timed_out:
        raise ModelError(f"{what} did not finish in {timeout_s:g} s")
    failed = [r for r, p in enumerate(procs) if p.returncode != 0] + [r for r in answering if answers[r] is None]
    if failed:
        cause = next((r for r in failed if errors[r]), failed[0])
        raise ModelError(f"{what} failed: rank {cause}: {errors[cause][-1] if errors[cause] else 'no message'}")
    return [_parsed(answers[r], what, r) if r in answering else None for r in range(world)]


def _read_answer(pipe, mark: bytes, answers: list, r: int) -> None:
    """The rank's marked line (the last), kept only when it is at most MAX_ANSWER bytes; the rest is read past."""
    fresh = True           # at the start of a line (a long line arrives in several chunks)
    for chunk in iter(lambda: pipe.readline(MAX_ANSWER + 1), b""):
        whole = chunk.endswith(b"\n")
        if fresh and chunk.startswith(mark):
            answers[r] = chunk[len(mark):] if whole else _TOO_LONG
        fresh = whole


def _read_tail(pipe, tail: list[str]) -> None:
    """The last ERR_LINES lines (each cut at MAX_ERR_LINE) of the rank's stderr."""
    fresh = True
    for chunk in iter(lambda: pipe.readline(MAX_ERR_LINE), b""):
        if fresh and chunk.strip():
            tail.append(chunk.decode("utf-8", "replace").strip())
            del tail[:-ERR_LINES]
        fresh = chunk.endswith(b"\n")


def _parsed(raw, what: str, r: int):
    if raw is _TOO_LONG:
        raise ModelError(f"{what} failed: rank {r} answered with a line over {MAX_ANSWER} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:       # UnicodeDecodeError is a ValueError
        raise ModelError(f"{what} failed: rank {r} answered with what is not JSON ({first_line(e)[:80]})") from None
