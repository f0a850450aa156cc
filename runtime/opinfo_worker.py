"""OpInfos on a compiler stack, in a child process: a stack that dies (SIGFPE, SIGSEGV) or hangs inside its own
C++ takes that OpInfo down, not the check of every other one.

    report = check_in_workers("onnxruntime", names, backend_name="onnxruntime")   # what check_opinfo(spec=...) does

One worker (`python -m opscope.runtime.opinfo_worker SPEC DTYPE SAMPLES`) reads the OpInfo names from stdin and
answers on a pipe of its own, one JSON line per message (never a pickle: the parent reads nothing that can run
code), at most MAX_LINE bytes each:

    {"running": NAME}       before each OpInfo, in the order given
    {"result": {...}}       OpInfoResult.as_dict() of that OpInfo
    {"error": MESSAGE}      the worker itself raised (the OpInfo it was on is a crash)

When the worker dies by a signal, goes silent for `timeout` seconds, or sends a line the parser refuses, the
OpInfo it was running is a "crash" saying so, the worker is killed, and a fresh one takes the names left.
Backends made of opscope's own in-process kernels (numpy, torch, sim) do not need this (runs_foreign_code).
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import time

from .child import python_command, start
from .errors import ModelError, first_line, signal_name

MAX_LINE = 64 * 1024                # a result is a few hundred bytes; more is a broken (or hostile) worker
TIMEOUT_S = 300.0                   # one OpInfo (three samples, or up to 500 draws of a random op) on a stack
START_S = 300.0                     # importing torch, the OpInfo database and the stack, on a loaded machine
FD_ENV = "OPSCOPE_OPINFO_FD"        # the worker's end of the answer pipe
PARENT_ENV = "OPSCOPE_OPINFO_PARENT"


class LineRefused(ValueError):
    """A line from the worker that is not one of the protocol's messages."""


def runs_foreign_code(backend) -> bool:
    """Does anything in the backend's chain run code opscope does not own (a compiler stack, a vendor module)?
    Decided by each description's implementation, so a .toml naming `implementation = "openvino"` counts too:
    only opscope's own per-op kernels (registry: built in, kind "ops") run in this process's Python."""
    from . import registry

    def own(b) -> bool:
        entry = registry.get(b.description.implementation)
        return entry is not None and entry.own_kernels
    return not all(own(b) for b in [backend, *backend.fallback_chain()])


def check(backend, names=None, *, spec: str, progress=None, timeout: float | None = None, samples_per_op: int = 3,
          dtype: str = "float32"):
    """`backend check SPEC --opinfo`: the OpInfos in worker processes when the backend runs code opscope does not
    own (a stack that dies by a signal or hangs more than `timeout` s on one OpInfo is that OpInfo's crash, not the
    end of the check), else in this process. `spec`: what `backend` was resolved from (the workers resolve it)."""
    from .opinfo import _full_name, check_opinfo, select
    if not runs_foreign_code(backend):
        return check_opinfo(backend, names, progress, samples_per_op, dtype)
    return check_in_workers(spec, [_full_name(o) for o in select(names, dtype)], backend_name=backend.name,
                            progress=progress, samples_per_op=samples_per_op, dtype=dtype, timeout=timeout or TIMEOUT_S)


def parse_line(raw: bytes) -> tuple[str, object]:
    """(kind, value) of one worker line: ("running", name), ("result", OpInfoResult) or ("error", message).
    Anything else -- too long, not UTF-8, not JSON, nested past reason, the wrong fields -- is LineRefused."""
    from .opinfo import STATUSES, OpInfoResult

    if len(raw) > MAX_LINE:
        raise LineRefused(f"a line of {len(raw)} bytes (at most {MAX_LINE})")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:       # UnicodeDecodeError is a ValueError; a deep nest a RecursionError
        raise LineRefused(f"a line that is not JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict) or len(doc) != 1:
        raise LineRefused("a line that is not one message")
    (kind, value), = doc.items()
    if kind in ("running", "error") and isinstance(value, str):
        return kind, value[:2000]
    if kind != "result" or not isinstance(value, dict):
        raise LineRefused(f"an unknown message {kind[:40]!r}")
    ops, samples, seconds = value.get("ops"), value.get("samples"), value.get("seconds")
    if not (isinstance(value.get("opinfo"), str) and value.get("status") in STATUSES
            and isinstance(ops, list) and all(isinstance(o, str) for o in ops)
            and type(samples) is int and samples >= 0 and isinstance(value.get("message"), str)
            and type(seconds) in (int, float) and math.isfinite(seconds) and seconds >= 0):
        raise LineRefused("a result without the fields of one")
    return kind, OpInfoResult(value["opinfo"], value["status"], ops, samples, value["message"], float(seconds))


class _Worker:
    """One worker process and the read end of its answer pipe, read a bounded line at a time."""

    def __init__(self, argv, names, backend: str):
        self.backend = backend
        read, write = os.pipe()
        env = dict(os.environ, **{FD_ENV: str(write), PARENT_ENV: str(os.getpid())})
        try:
            # its own session and process group (Python 3.10 has no process_group=): a terminal's Ctrl-C reaches the parent, which ends the worker (no second
            # traceback from it); stdin carries the names, as JSON
            self.proc = start(argv, stdin=subprocess.PIPE, env=env, pass_fds=(write,), start_new_session=True)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.fd, self.buf = read, b""
        try:
            self.proc.stdin.write(json.dumps(names).encode() + b"\n")
            self.proc.stdin.close()
        except BrokenPipeError:            # it died already: the read below says how
            pass
        except BaseException:              # Ctrl-C here: nobody else would end it
            self.close()
            raise

    def read(self, timeout: float):
        """The next message, None at the end of the pipe; TimeoutError after `timeout` s of silence."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise LineRefused(f"a line of over {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return parse_line(line)

    def ended(self) -> tuple[str, bool]:
        """(how the worker ended, whether a signal ended it), waiting a moment for it, then killing it."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.close()
            return "it closed its answers and went silent (it was killed)", False
        if code >= 0:
            return f"exit code {code}", False
        return signal_name(-code), True

    def close(self) -> None:
        # the whole group: what the stack (or an OpInfo's sample) forked from the worker goes with it
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def check_in_workers(spec: str, names: list[str], *, backend_name: str, progress=None, samples_per_op: int = 3,
                     dtype: str = "float32", timeout: float = TIMEOUT_S, argv=None):
    """check_opinfo's report for `names` on the backend `spec`, each OpInfo run in a worker process.
    `argv`: the worker's command (tests give a broken one); by default this module's main()."""
    from .opinfo import OpInfoReport, OpInfoResult

    argv = argv or python_command(__name__, spec, dtype, str(samples_per_op))
    report, todo = OpInfoReport(backend_name), list(names)
    t0 = time.perf_counter()
    while todo:
        worker, running, started, why = _Worker(argv, todo, backend_name), None, 0.0, ""
        try:
            while todo:
                try:
                    message = worker.read(timeout if running else max(timeout, START_S))
                except TimeoutError:
                    why = f"no answer in {timeout if running else max(timeout, START_S):g} s (the worker was killed)"
                    break
                except LineRefused as e:
                    why = f"the worker sent {e} (it was killed)"
                    break
                if message is None:
                    how, signalled = worker.ended()
                    why = (f"{how} inside the stack ({backend_name}); the check went on in a fresh process" if signalled
                           and running else f"the worker died ({how})" if signalled else f"the worker ended ({how})")
                    break
                kind, value = message
                if kind == "error":
                    why = f"the worker raised: {value}"
                    break
                if kind == "running" and running is None and value == todo[0]:
                    running, started = value, time.perf_counter()
                    if progress:
                        progress(value)
                elif kind == "result" and running is not None and value.name == running:
                    report.results.append(value)
                    todo.pop(0)
                    running = None
                else:
                    said = str(getattr(value, "name", value))[:80]
                    why = f"the worker sent {kind} {said!r} out of turn (it was killed)"
                    break
        finally:
            worker.close()
        if not todo:
            break
        if running is None:      # it died before starting one: a fresh worker would too
            raise ModelError(f"the OpInfo worker for {backend_name} failed before checking {todo[0]}: {why}")
        report.results.append(OpInfoResult(running, "crash", message=why[:500], seconds=time.perf_counter() - started))
        todo.pop(0)
    report.seconds = time.perf_counter() - t0
    return report


def _die_with_parent() -> None:
    """The worker must not go on running OpInfos for a parent that is gone (kill -9): on Linux the kernel
    kills it then (PR_SET_PDEATHSIG); elsewhere a closed pipe ends it at its next answer."""
    parent = int(os.environ.pop(PARENT_ENV, "0") or 0)
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)    # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent and os.getppid() != parent:    # it died before the line above
        os._exit(1)


def main() -> None:
    fd = int(os.environ.pop(FD_ENV))
    _die_with_parent()
    os.dup2(2, 1)            # a stack printing from C++ must not reach the parent's stdout (a --json document)
    names = json.loads(sys.stdin.readline())
    spec, dtype, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
    answers = os.fdopen(fd, "wb", buffering=0)

    def send(kind, value):
        answers.write(json.dumps({kind: value}).encode() + b"\n")

    code = 0
    try:
        from .backends import resolve
        from .opinfo import check_opinfo
        # the spec is the user's, on this worker's command line as on the parent's (resolve's trust rule)
        check_opinfo(resolve(spec), names, progress=lambda name: send("running", name), samples_per_op=samples,
                     dtype=dtype, on_result=lambda r: send("result", {**r.as_dict(), "message": r.message[:2000]}))
    except BrokenPipeError:  # the parent is gone
        code = 1
    except BaseException as e:   # noqa: BLE001 -- whatever it was, the parent names it on the OpInfo it was on
        try:
            send("error", f"{type(e).__name__}: {first_line(e)}"[:2000])
        except OSError:
            pass
        code = 1
    sys.stderr.flush()
    # NOTE: no interpreter shutdown: a stack's static destructors have crashed there, after every answer was in
    os._exit(code)


if __name__ == "__main__":
    main()
