"""The runner: runs the model and streams its events to a collector.

    OPSCOPE_PARENT_PIPE=<fd> OPSCOPE_PARENT_PID=<pid> \
        python -m opscope.profiler.runner --model demo:gpt --backend torch:cpu ...
    # then the parent writes handover(endpoint, key) into the pipe <fd>

Only live.py starts it. The stream's endpoint and key come down a pipe (_take_stream says why not the
environment or the command line), and the runner dies with the process that started it (die_with_parent).

`execute()` is the part that does not care where events go; profile() calls it in-process
when the caller hands over model objects instead of a spec.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback

from opscope.runtime.errors import UsageError
from opscope.runtime.fallback import parse_flag

ENGINES = ("graph", "eager")
CAPTURES = ("export", "dynamo")         # how the graph engine gets its graph: torch.export, or torch.compile regions
PIPE_ENV = "OPSCOPE_PARENT_PIPE"        # the parent's pipe: the stream's endpoint and key, then EOF (_take_pipe)
STREAM_ENV = "OPSCOPE_STREAM"           # the same line where no pipe can be passed (Windows; see _take_stream)
PARENT_ENV = "OPSCOPE_PARENT_PID"       # the collecting process: when it dies, so does the runner
PDEATHSIG_ENV = "OPSCOPE_PDEATHSIG"     # "1": the parent spawned us from its main thread (see die_with_parent)
PR_SET_PDEATHSIG = 1                    # <linux/prctl.h>


def check_eager_backend(backend, backend_spec: str) -> None:
    if not backend.name.startswith("torch:"):
        raise UsageError(f"--engine eager runs PyTorch itself, so it needs a torch backend, not {backend_spec!r}: "
                         "use --backend torch:cpu or torch:cuda:0")


def check_capture(capture: str, engine: str, train) -> None:
    if capture not in CAPTURES:
        raise UsageError(f"unknown capture {capture!r}: use {' or '.join(CAPTURES)}")
    if capture == "dynamo" and (engine != "graph" or train is not None):
        raise UsageError("--capture dynamo records the regions torch.compile runs on the backend: it goes with "
                         "--engine graph and without --train (a compiled training loop: profile its script)")


def execute(sink, *, model_spec: str, backend_spec: str, steps: int = 1, warmup: int = 0, values: bool = False,
            engine: str = "graph", allow_fallback: bool = True, model=None, inputs=None, on_meta=None,
            train: dict | None = None, on_train=None, capture: str = "export", use_tuned: bool = False) -> int:
    """Warm up (unrecorded), then record `steps` steps into `sink`; returns events recorded.

    train = {"optimizer": "sgd", "lr": 0.01}: every step is a training step (forward, backward and the
    optimizer, one plan); on_train gets what the run keeps about it (phases, losses, memory by category).
    capture = "dynamo": the model runs through torch.compile with the opscope backend; a step is one call
    of the model, recorded across every region it ran (runtime/dynamo.py).
    """
    check_capture(capture, engine, train)
    if capture == "dynamo":
        return _execute_dynamo(sink, model_spec=model_spec, backend_spec=backend_spec, steps=steps, warmup=warmup,
                               values=values, allow_fallback=allow_fallback, model=model, inputs=inputs,
                               on_meta=on_meta)
    if train is not None:
        return _execute_train(sink, model_spec=model_spec, backend_spec=backend_spec, steps=steps, warmup=warmup,
                              values=values, engine=engine, allow_fallback=allow_fallback, model=model,
                              inputs=inputs, on_meta=on_meta, train=train, on_train=on_train)
    if engine == "eager":
        from opscope.runtime import backends, models
        from .eager import run_eager
        backend = backends.resolve(backend_spec)
        check_eager_backend(backend, backend_spec)
        if model is None:
            model, inputs = models.load(model_spec)
        if on_meta:
            on_meta({"backend": backend.name, "device": backend.device, "description": backend.description.as_dict()})
        return run_eager(model, inputs, sink, steps=steps, warmup=warmup, values=values, backend=backend.name,
                         device=backend.device)

    from opscope.runtime import open_session
    from .recorder import Recorder
    if model is None and use_tuned:       # what `opscope tune` cached for this model, backend and versions
        from .tune import open_tuned_session
        s, tuned = open_tuned_session(model_spec, backend_spec, allow_fallback=allow_fallback)
        if tuned and on_train:
            on_train({"tuned": {"config": tuned["config"], "speedup": tuned["speedup"], "says": tuned["says"]}})
    else:
        s = open_session(model_spec, backend_spec, allow_fallback=allow_fallback, model=model, inputs=inputs)
    if on_meta:
        from opscope.runtime.buffers import buffer_lifetimes
        from opscope.runtime.passes.fuse import fused_members
        # a fused node's members and each buffer's lifetime (allocating and freeing step), kept with the run
        rep = {**s.plan.placement.report(), "buffers": buffer_lifetimes(s.plan)}
        fused = fused_members(st.node for st in s.plan.steps)
        on_meta({"backend": s.backend.name, "device": s.backend.device, "nodes": len(s.graph.nodes),
                 "description": s.backend.description.as_dict(), "placement": {**rep, "fused": fused} if fused else rep})
    for _ in range(warmup):
        s.run()
    rec = Recorder(sink, values=values)
    with s.executor.hooked(rec):
        for _ in range(steps):
            s.run()
    return rec.events


def _execute_dynamo(sink, *, model_spec, backend_spec, steps, warmup, values, allow_fallback, model, inputs,
                    on_meta) -> int:
    import logging

    from opscope.runtime.dynamo import open_dynamo_session
    from .recorder import Recorder
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)   # graph breaks: the run's meta lists them
    s = open_dynamo_session(model_spec, backend_spec, allow_fallback=allow_fallback, model=model,
                            inputs=inputs)                    # compiles: the first call runs here
    for _ in range(warmup):
        s.run()
    rec = Recorder(sink, values=values, regions=True)
    try:
        with s.hooked(rec):
            for _ in range(steps):
                s.run()
                rec.end_step()
    finally:
        if on_meta:                   # after the steps: a region compiled late (a new shape) counts too
            stats = s.dynamo.stats()
            on_meta({"backend": s.backend.name, "device": s.backend.device, "nodes": stats["nodes"],
                     "description": s.backend.description.as_dict(), "placement": stats["placement"],
                     "capture": {"kind": "dynamo", **{k: stats[k] for k in ("regions", "graph_breaks",
                                                                           "break_reasons", "graphs")},
                                 "capture_seconds": s.capture_seconds}})
    return rec.events


def _execute_train(sink, *, model_spec, backend_spec, steps, warmup, values, engine, allow_fallback, model, inputs,
                   on_meta, train, on_train) -> int:
    from opscope.runtime import backends, models
    from opscope.runtime.train import DEFAULT_LR, OptimizerSpec, Trainer
    from opscope.runtime.buffers import buffer_lifetimes
    from opscope.runtime.train.memory import memory_timeline
    from .recorder import Recorder
    if engine != "graph":
        raise UsageError("--train records the captured training step (--engine graph); to profile a training "
                         "loop as written, profile its script: opscope profile -- python train.py")
    name = train.get("optimizer") or "sgd"
    opt = OptimizerSpec(name, lr=train.get("lr") or DEFAULT_LR.get(name, 1e-2))
    backend = backends.resolve(backend_spec)
    if model is None:
        model, inputs = models.load_train(model_spec)
    t = Trainer.create(model, inputs, backend, opt, name=model_spec, allow_fallback=allow_fallback)
    if on_meta:
        on_meta({"backend": backend.name, "device": backend.device, "nodes": len(t.train.graph.nodes),
                 "description": backend.description.as_dict(),
                 "placement": {**t.plan.placement.report(), "buffers": buffer_lifetimes(t.plan)}})
    info = {"optimizer": opt.name, "lr": opt.lr, "phases": t.phase_counts(), "memory": t.memory(),
            "memory_timeline": memory_timeline(t), "capture_seconds": t.capture_seconds, "losses": []}
    for _ in range(warmup):
        t.step()
    rec = Recorder(sink, values=values)
    try:
        with t.executor.hooked(rec):
            for _ in range(steps):
                info["losses"].append(t.step())
    finally:
        if on_train:
            on_train(info)
    return rec.events


def _execute_script(sink, a) -> None:
    from opscope.runtime import backends
    from .script import run_script
    backend = backends.resolve(a.backend)
    check_eager_backend(backend, a.backend)
    sink.control("meta", backend=backend.name, device=backend.device, nodes=None, placement=None,
                 description=backend.description.as_dict())
    run_script(sink, a.command, backend=backend.name, device=backend.device, values=a.values,
               on_info=lambda info: sink.control("train", info=info),
               engine="eager" if a.engine == "eager" else "native")


def _send_meta(sink, meta: dict) -> None:
    meta = {"nodes": None, "placement": None, **meta}
    capture = meta.pop("capture", None)
    sink.control("meta", **meta)
    if capture:
        # NOTE: the wire's meta message has a closed set of fields; the run-info message ("train", a free-form
        # dict) carries what torch.compile reported, and live.py files it under config["capture"]
        sink.control("train", info={"capture": capture})


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m opscope.profiler.runner")
    p.add_argument("--model", default="")
    p.add_argument("--backend", required=True)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--values", action="store_true")
    p.add_argument("--engine", choices=(*ENGINES, "native"), default="graph")   # native: scripts only
    p.add_argument("--capture", choices=CAPTURES, default="export")
    p.add_argument("--no-fallback", action="store_true")
    p.add_argument("--fallback", action="append")
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--hwm", type=int, default=64)
    p.add_argument("--train", action="store_true")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--script", action="store_true", help="run the command after -- (python script.py ARGS)")
    p.add_argument("command", nargs="*")
    return p.parse_args(argv)


def die_with_parent(parent: int, pdeathsig: bool, poll_s: float = 0.2) -> None:
    """A runner whose parent is gone (kill -9, a crash) must not go on burning CPU for nobody.

    On Linux the kernel sends SIGKILL when the parent dies (PR_SET_PDEATHSIG). NOTE: "parent" there is
    the *thread* that spawned us, so the parent says (PDEATHSIG_ENV) whether that was its main thread;
    a runner started from a worker thread (a web request) would be killed when that thread ends. A
    thread that watches for a new parent pid (an orphan is re-parented) covers that case and macOS.
    NOTE: on Windows getppid() never changes; there it would take a job object.
    """
    if pdeathsig and sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass                                   # the watcher below still works
    first = os.getppid()
    if first != parent and os.name == "posix":     # it died before we got here (on Windows a venv's
        os._exit(1)                                # launcher process sits between the two)

    def watch():
        while os.getppid() == first:
            time.sleep(poll_s)
        os._exit(1)
    threading.Thread(target=watch, name="opscope-parent-watch", daemon=True).start()


MAX_HANDOVER = 4096                     # one line: an endpoint (a socket path is ~100 bytes) and a key


def handover(endpoint: str, key: bytes) -> bytes:
    """What the parent writes into the pipe once its collector listens: one line, under PIPE_BUF (atomic)."""
    return f"{endpoint} {key.hex()}\n".encode()


def _take_stream(pipe: int | None) -> tuple[str, bytes] | None:
    """(endpoint, key) from the parent's pipe, or None.

    Why a pipe: the environment a process was started with stays readable in /proc/PID/environ by
    every process of the same user for as long as it runs, whatever os.environ.pop does (a same-user
    process read the key there and forged a run's end), and the command line shows in `ps` to everyone.
    A pipe is read once and leaves nothing behind. NOTE: Windows has no descriptor to pass: there the
    line comes in the environment, which the same user can read (stream.py says what that means)."""
    if pipe is None:
        line = os.environ.pop(STREAM_ENV, "").encode()
    else:
        line = b""
        try:
            while not line.endswith(b"\n") and len(line) < MAX_HANDOVER:
                chunk = os.read(pipe, MAX_HANDOVER - len(line))      # the parent writes it in one go
                if not chunk:                                        # the parent is gone, or wrote nothing
                    break
                line += chunk
        except OSError:
            return None
    endpoint, _, key = line.decode("utf-8", "replace").strip().rpartition(" ")
    try:
        key = bytes.fromhex(key)
    except ValueError:
        return None
    return (endpoint, key) if endpoint and len(key) == 32 else None


def _take_pipe() -> int | None:
    """The read end of the parent's pipe, or None. The parent writes the stream's endpoint and key into
    it (_take_stream) and closes it once "your end arrived".

    Why the runner waits for that: ZeroMQ drops what still sits in the socket when the sender exits while
    the reader's queue is full, and on a loaded machine the collector can be seconds behind. The
    runner's flush only hands its messages to the kernel, so a runner that exits then loses its end
    and the batches before it (seen in CI: "exited with code 0 without reporting the end of the run").
    PUSH/PULL has no way back, hence a pipe; one the model's own subprocesses do not inherit."""
    fd = os.environ.pop(PIPE_ENV, "")
    if not fd.isdigit():
        return None
    try:
        os.set_inheritable(int(fd), False)
    except (OSError, OverflowError):     # not an open descriptor: no pipe (nor a stream, unless in the environment)
        return None
    return int(fd)


def _wait_for_ack(fd: int | None, timeout_s: float) -> None:
    """Block until the collector has the end or is gone (either way the pipe reads EOF), or timeout_s."""
    if fd is None:
        return
    import select
    try:
        select.select([fd], [], [], timeout_s)
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv=None) -> int:
    a = _args(argv)
    parent = os.environ.pop(PARENT_ENV, "")
    if parent.isdigit():                   # first: a parent that dies before it writes must not leave us waiting
        die_with_parent(int(parent), os.environ.pop(PDEATHSIG_ENV, "") == "1")
    ack = _take_pipe()
    stream = _take_stream(ack)
    if stream is None:
        print("opscope runner: no stream endpoint and key came from the parent: runners are started by "
              "`opscope profile`", file=sys.stderr)
        return 2
    from .stream import END_TIMEOUT_MS, StreamSink
    sink = StreamSink(*stream, hwm=a.hwm)
    sink.control("hello", pid=os.getpid(), t_ns=time.perf_counter_ns())
    code, delivered = 0, False
    try:
        if a.script:
            _execute_script(sink, a)
        else:
            execute(sink, model_spec=a.model, backend_spec=a.backend, steps=a.steps, warmup=a.warmup,
                    values=a.values, engine=a.engine, allow_fallback=parse_flag(a.fallback) or not a.no_fallback,
                    on_meta=lambda meta: _send_meta(sink, meta),
                    train={"optimizer": a.optimizer, "lr": a.lr} if a.train else None,
                    on_train=lambda info: sink.control("train", info=info), capture=a.capture,
                    use_tuned=not a.no_tune)
        delivered = sink.end("ok")
    except Exception as e:
        from opscope.runtime.errors import OpscopeError
        kind = "usage" if isinstance(e, UsageError) else "model"
        msg = str(e) if isinstance(e, OpscopeError) else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        if not isinstance(e, OpscopeError):
            traceback.print_exc()           # into the runner log the run keeps as an artifact
        delivered = sink.end("failed", error=msg, error_kind=kind)
        code = 2 if kind == "usage" else 1
    if delivered:          # the connection must stay open until the end is read (_take_pipe says why)
        _wait_for_ack(ack, END_TIMEOUT_MS / 1000)
    sink.close(flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
