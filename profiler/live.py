"""Profiling a model: in a runner process with a live stream into the store, or in-process.

    run_id = profile("demo:gpt", "torch:cpu", steps=3, warmup=1)       # blocks; RunFailed if the model fails
    live = start_profile("demo:gpt", "sim:npu-a1", steps=100)          # returns at once; what the web app uses
    live.poll(); live.events_received; live.dropped; live.rejected; live.wait()

The collector (a thread of the calling process) writes batches into the store as they arrive and
keeps runs.events / runs.dropped current; a model that raises, or a runner that dies, leaves a
failed run with every event that arrived. A run whose events did not all arrive (the runner's own
count says more than the store holds plus what was counted as dropped) ends `incomplete`, its error
naming the steps that lost events; config["stream"] says how many messages (`rejected`) and
connections from other processes (`refused_connections`) the collector refused.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

from opscope.runtime.child import python_command, start
from opscope.runtime.errors import ModelError, UsageError, signal_name

# NOTE: runner.py is imported where it is used: the package must not import it, or `python -m
# opscope.profiler.runner` warns (into a profiled script's output) that it ran a module already imported.
from .store import RunStore
from .stream import DEFAULT_HWM, Collector


class RunFailed(ModelError):
    """The model raised or its runner died; the failed run (with its events so far) is `run_id`."""

    def __init__(self, message: str, run_id: str):
        super().__init__(message)
        self.run_id = run_id


def _check(model_spec, backend_spec, steps, warmup, engine, train=None, capture="export"):
    """Bad input fails here, before a run or a process exists."""
    from opscope.runtime import backends
    from opscope.runtime.specs import check_model_spec
    from .runner import ENGINES, check_capture, check_eager_backend
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: use {' or '.join(ENGINES)}")
    check_capture(capture, engine, train)
    if train is not None:
        from opscope.runtime.train import OptimizerSpec
        OptimizerSpec(train.get("optimizer") or "sgd", lr=train.get("lr") or 1.0)     # unknown optimizer, bad lr
        if train.get("lr") is not None and not train["lr"] > 0:
            raise UsageError(f"--lr must be > 0 (got {train['lr']})")
        if engine != "graph":
            raise UsageError("--train records the captured training step (--engine graph); to profile a training "
                             "loop as written, profile its script: opscope profile -- python train.py")
    if steps < 1 or warmup < 0:
        raise UsageError(f"--steps must be >= 1 and --warmup >= 0 (got {steps} and {warmup})")
    backend = backends.resolve(backend_spec)
    if engine == "eager":
        check_eager_backend(backend, backend_spec)
    check_model_spec(model_spec)
    return backend


_LIVE: weakref.WeakSet = weakref.WeakSet()     # the LiveRuns this process started


def interrupt_all() -> None:
    """Ctrl-C on the command (app/cli/__init__.py waits for the runs to close): every run still going is
    stored as interrupted, not as failed by SIGKILL, and its runner is killed (it ignores SIGINT)."""
    for live in list(_LIVE):
        if live.status == "running":
            live._interrupted = True
            if live.proc.poll() is None:
                live.proc.kill()


def _ctrl_c_is_the_parents() -> None:
    """preexec_fn of a runner: SIGINT ignored (inherited across exec, and Python then installs no
    KeyboardInterrupt handler). A terminal's Ctrl-C goes to its whole foreground process group, the runner
    included; raised in the runner it could land inside torch's C++ (an abort: "terminate called after
    throwing an instance of ..."), or end the runner before the parent marked the run interrupted, so the
    run was stored failed and the parent had no run to keep (CI, under load). The parent answers Ctrl-C:
    it marks the run interrupted, kills the runner, keeps what arrived (interrupt_all, LiveRun.interrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LiveRun:
    """A run in progress in a runner process; the collector runs in a thread of this process."""

    def __init__(self, store: RunStore, run_id: str, *, argv: list[str], hwm: int, py_spy: bool, hardware: bool,
                 echo=None):
        self.store, self.run_id = store, run_id
        self.status = "running"
        self._interrupted = False        # the user stopped it (Ctrl-C): stored as interrupted, not failed
        _LIVE.add(self)
        self.error: str | None = None
        self.error_kind: str | None = None
        self.meta: dict = {}
        self._py_spy = None
        self._want_py_spy = py_spy
        self._hardware = None
        self._done = threading.Event()
        self._finishing = threading.Lock()
        self._log = tempfile.NamedTemporaryFile(prefix="opscope-runner-", suffix=".log", delete=False)
        from .runner import PARENT_ENV, PDEATHSIG_ENV, PIPE_ENV, STREAM_ENV, handover
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{
            PARENT_ENV: str(os.getpid()),
            PDEATHSIG_ENV: "1" if threading.current_thread() is threading.main_thread() else "0"})
        # The runner starts first, so that its collector listens to the runner's process alone (stream.py);
        # then the stream's endpoint and key go down this pipe, never into the runner's environment or
        # command line (runner._take_stream), and at the end its closing says "your end arrived" (_take_pipe).
        pipe_r, self._ack = os.pipe() if os.name == "posix" else (None, None)
        self.collector = None
        if pipe_r is None:               # NOTE: no descriptor to pass (Windows): the line goes in the environment
            self.collector = Collector(store, run_id, hwm=hwm, on_control=self._on_control).start()
            env[STREAM_ENV] = handover(self.collector.endpoint, self.collector.key).decode().strip()
        else:
            env[PIPE_ENV] = str(pipe_r)
        # a profiled script talks to its user (echo: their terminal); a model's runner only to the log
        try:
            self.proc = start(python_command("opscope.profiler.runner", "--hwm", str(hwm), *argv),
                              stdout=self._log if echo is None else subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL if echo is None else None,
                              env=env, pass_fds=(pipe_r,) if pipe_r is not None else (),
                              preexec_fn=_ctrl_c_is_the_parents if os.name == "posix" else None)
        finally:
            if pipe_r is not None:       # the runner holds its own copy
                os.close(pipe_r)
        if self.collector is None:
            try:
                self.collector = Collector(store, run_id, runner_pid=self.proc.pid, hwm=hwm,
                                           on_control=self._on_control).start()
            except BaseException:        # no collector: no runner either
                self.proc.kill()
                self.proc.wait()
                os.close(self._ack)
                raise
            try:
                os.write(self._ack, handover(self.collector.endpoint, self.collector.key))
            except BrokenPipeError:      # the runner is gone already: the watcher ends the run failed, saying how
                pass
        self.pid = self.proc.pid
        self._pump = None
        if echo is not None:
            self._pump = threading.Thread(target=_pump, args=(self.proc.stdout, self._log, echo),
                                          name=f"opscope-echo-{run_id}", daemon=True)
            self._pump.start()
        if hardware:
            from .hardware import HardwareSampler
            self._hardware = HardwareSampler(store, run_id, self.pid).start()
        # the run ends in the store even if nobody polls (a web server that only reads the store)
        self._watcher = threading.Thread(target=self._watch, name=f"opscope-run-{run_id}", daemon=True)
        self._watcher.start()

    # --- what a live view reads ----------------------------------------------------------
    @property
    def events_received(self) -> int:
        return self.collector.events

    @property
    def dropped(self) -> int:
        return self.collector.dropped

    @property
    def steps_received(self) -> int:
        """Recorded steps whose events have reached the store so far (what a progress bar shows)."""
        return len(self.collector.writer.step_events) if self.collector is not None else 0

    @property
    def rejected(self) -> int:
        """Messages the collector refused (not from this run's runner, or malformed)."""
        return self.collector.rejected

    def poll(self) -> str:
        """The status now: 'running', 'ok', 'incomplete' (events lost on the way) or 'failed'."""
        return self.status

    def wait(self, timeout: float | None = None) -> str:
        """Wait for the run to end (the store row is final when this returns a status other than running)."""
        self._done.wait(timeout)
        return self.status

    def _watch(self) -> None:
        while not self.collector.ended.wait(0.05) and self.proc.poll() is None:
            pass
        try:
            self._finish()
        except Exception:       # kept in self.error: wait() returns "failed" and the caller says why in one line
            pass

    def kill(self) -> None:
        """Stop the model (SIGKILL); the run ends failed, with the events that arrived."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.wait()

    def interrupt(self) -> None:
        """The user stopped the run (Ctrl-C): the model is killed and the run is stored as
        "interrupted", its steps the ones whose events arrived (not the steps asked for)."""
        self._interrupted = self.status == "running"
        self.kill()

    # --- collector callbacks and the end of a run ----------------------------------------
    def _on_control(self, head: dict) -> None:
        kind = head["kind"]
        if kind == "hello" and self._want_py_spy:
            from .pyspy import PySpy
            self._py_spy = PySpy(head["pid"]).start()
        elif kind == "train" and len(head["info"]) == 1 and set(head["info"]) <= {"capture", "tuned"}:
            # torch.compile's regions, or the tuned configuration the runner used (runner.py)
            self.store.update_run(self.run_id, config=dict(head["info"]))
        elif kind == "train":
            info = head["info"]
            steps = {"steps": info["steps"]} if info.get("script") and type(info.get("steps")) is int else {}
            if info.get("script") and info.get("engine") in ("native", "eager"):
                steps["engine"] = info["engine"]      # the engine that ran (native falls back to eager)
            self.store.update_run(self.run_id, config={"train": info}, **steps)
        elif kind == "meta":
            self.meta = {k: v for k, v in head.items() if k not in ("kind", "dropped")}
            desc = self.meta.get("description") or {}
            import json
            config = {"placement": self.meta.get("placement"), "nodes": self.meta.get("nodes")}
            if self.meta.get("capture"):          # torch.compile: regions, graph breaks and their reasons
                config["capture"] = self.meta["capture"]
            self.store.update_run(self.run_id, device=self.meta.get("device") or "",
                                  description_hash=desc.get("digest"),
                                  description=json.dumps(desc, sort_keys=True, default=str), config=config)

    def _finish(self) -> None:
        with self._finishing:
            if self.status != "running":
                return
            try:
                self._end_run()
            except BaseException as e:             # the store itself failed: say so, never hang wait()
                from opscope.runtime.errors import OpscopeError
                self.error = str(e) if isinstance(e, OpscopeError) else \
                    f"finishing the run failed: {type(e).__name__}: {e}"
                self.status = "failed"
                # the run's own row, small, may still go where the rest (config, log) did not: failed, saying
                # why, its count the rows stored; if not, readers show it failed once this process is gone
                with contextlib.suppress(Exception):
                    self.store.finish_run(self.run_id, status="failed", error=self.error,
                                          dropped=self.collector.dropped)
                raise
            finally:
                self._done.set()

    def _end_run(self) -> None:
        if self._ack is not None:                  # the end arrived (or never will): let the runner exit
            os.close(self._ack)
            self._ack = None
        try:
            self.proc.wait(timeout=30 if self.collector.ended.is_set() else 5)
        except subprocess.TimeoutExpired:          # said "end" but hangs on exit (a stuck thread)
            self.proc.kill()
            self.proc.wait()
        # A runner that exited cleanly sent its end: on a loaded machine it may still sit in the socket
        # behind a backlog, and ZeroMQ's I/O thread can pause longer than the usual half second between
        # two messages. The drain stops as soon as the end is in, so waiting longer costs nothing then.
        self.collector.stop(drain_s=10.0 if self.proc.returncode == 0 else 0.5)
        if self._pump is not None:
            self._pump.join(5)
        if self._hardware:
            self._hardware.stop()
        end = self.collector.end
        if self.collector.error is not None:
            status, error = "failed", f"collector: {type(self.collector.error).__name__}: {self.collector.error}"
        elif end is not None:
            status, error, self.error_kind = end["status"], end.get("error"), end.get("error_kind")
        else:
            status, error = "failed", _death(self.proc.returncode)
        missing, notes = self.collector.verdict()
        if not missing and end is not None and self.collector.error is None:
            from .batch import stored_shortfall        # the store's own count, not the collector's tally
            missing = stored_shortfall(self.store, self.run_id, end["events"], self.collector.dropped)
        if missing:
            status, error = ("incomplete", missing) if status == "ok" else (status, f"{error}; {missing}")
        if self._interrupted and status != "ok":
            kept = self.store.query("SELECT count(DISTINCT step) FROM events WHERE run_id = ?", [self.run_id])[0][0]
            asked = self.store.get_run(self.run_id).get("steps")
            status, error = "interrupted", f"interrupted by the user (Ctrl-C): {kept} of {asked} steps kept"
            self.store.update_run(self.run_id, steps=int(kept or 0), config={"steps_asked": asked})
        self.store.update_run(self.run_id, config={"stream": notes})
        self._keep_py_spy()
        self._keep_log()
        self.store.finish_run(self.run_id, status=status, error=error, dropped=self.collector.dropped)
        self.error = error
        self.status = status
        # a big run's op stats, times and analyses computed while it is stored, so no page visit waits on them;
        # a failure there leaves them to the first visit and never fails the run
        from .kept import when_stored
        with contextlib.suppress(Exception):
            when_stored(self.store, self.run_id, analyses="background")

    def _keep_py_spy(self) -> None:
        if not self._want_py_spy:
            return
        if self._py_spy is None:
            data, note = None, "py-spy did not start: the runner never reported its pid"
        else:
            data, note = self._py_spy.finish()
        if data is not None:
            from .pyspy import stack_spans
            self.store.add_artifact(self.run_id, "speedscope", "runner.speedscope.json", data)
            try:
                self.store.add_stacks(self.run_id, stack_spans(data, self._py_spy.t0_ns))
            except ValueError as e:
                note = f"py-spy wrote a profile opscope cannot read: {e}"
        if note:
            self.store.add_artifact(self.run_id, "note", "py-spy", note.encode())
            self.store.update_run(self.run_id, config={"py_spy": note})

    def _keep_log(self) -> None:
        self._log.close()
        try:
            data = Path(self._log.name).read_bytes()
            if data.strip():
                self.store.add_artifact(self.run_id, "log", "runner.log", data[-1_000_000:])
        finally:
            os.unlink(self._log.name)


def _pump(src, log, echo) -> None:
    """Copy the runner's output to the run's log and to the user, as it comes."""
    out = getattr(echo, "buffer", echo)
    fd = src.fileno()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        log.write(chunk)
        try:
            out.write(chunk)
            out.flush()
        except (OSError, ValueError):       # the user's terminal went away: the log still has it
            pass
    src.close()


def start_script(command: list[str], backend_spec: str = "torch:cpu", *, values: bool = False, py_spy: bool = False,
                 store: RunStore | None = None, hwm: int = DEFAULT_HWM, hardware: bool = True,
                 echo=None, engine: str = "native") -> LiveRun:
    """Profile `python script.py ARGS` as written; returns at once. Steps: the script's optimizer steps.
    engine: native (a C++ RecordFunction observer; the eager engine where it cannot build) or eager."""
    from opscope.runtime import backends
    from .runner import check_eager_backend
    from .script import SCRIPT_ENGINES, parse_command
    if engine not in SCRIPT_ENGINES:
        raise UsageError(f"unknown engine {engine!r} for a script: use {' or '.join(SCRIPT_ENGINES)}")
    kind, target, args = parse_command(command)          # bad input: before a run or a process exists
    backend = backends.resolve(backend_spec)
    check_eager_backend(backend, backend_spec)
    store = store or RunStore()
    shown = " ".join(["python", "-m" if kind == "module" else "", target, *args]).replace("  ", " ")
    run_id = store.create_run(model=shown, backend=backend.name, device=backend.device, engine=engine,
                              description=backend.description.as_dict(), steps=0, warmup=0,
                              config={"values": values, "py_spy": py_spy, "command": list(command)})
    argv = ["--backend", backend_spec, "--script", "--engine", engine, *(["--values"] if values else []), "--",
            *command]
    return LiveRun(store, run_id, argv=argv, hwm=hwm, py_spy=py_spy, hardware=hardware,
                   echo=echo if echo is not None else sys.stdout)


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        return f"the runner process was killed by {signal_name(-code)} before the model finished"
    return f"the runner process exited with code {code} without reporting the end of the run"


def start_profile(model_spec: str, backend_spec: str, *, steps: int = 1, warmup: int = 0, values: bool = False,
                  engine: str = "graph", py_spy: bool = False, config: dict | None = None,
                  store: RunStore | None = None, allow_fallback: bool = True, parent_run: str | None = None,
                  hwm: int = DEFAULT_HWM, hardware: bool = True, train: dict | None = None,
                  capture: str = "export", use_tuned: bool = True) -> LiveRun:
    backend = _check(model_spec, backend_spec, steps, warmup, engine, train, capture)
    store = store or RunStore()
    cfg = {"values": values, "py_spy": py_spy, "allow_fallback": allow_fallback, **(config or {})}
    if capture != "export":
        cfg["capture"] = {"kind": capture}
    if train is not None:
        cfg["train"] = dict(train)
    run_id = store.create_run(model=model_spec, backend=backend.name, device=backend.device, engine=engine,
                              description=backend.description.as_dict(), steps=steps, warmup=warmup, config=cfg,
                              parent_run=parent_run)
    argv = ["--model", model_spec, "--backend", backend_spec, "--steps", str(steps), "--warmup", str(warmup),
            "--engine", engine, "--capture", capture]
    if values:
        argv.append("--values")
    if not allow_fallback:
        argv.append("--no-fallback")
    elif isinstance(allow_fallback, (list, tuple)):       # --fallback's backends (runtime/fallback.py)
        argv += ["--fallback", ",".join(allow_fallback)]
    if not use_tuned:
        argv.append("--no-tune")
    if train is not None:
        argv += ["--train", "--optimizer", train.get("optimizer") or "sgd"]
        if train.get("lr") is not None:
            argv += ["--lr", repr(float(train["lr"]))]
    return LiveRun(store, run_id, argv=argv, hwm=hwm, py_spy=py_spy, hardware=hardware)


def profile(model_spec: str, backend_spec: str, *, steps: int = 1, warmup: int = 0, values: bool = False,
            engine: str = "graph", py_spy: bool = False, config: dict | None = None, store: RunStore | None = None,
            model=None, inputs=None, allow_fallback: bool = True, parent_run: str | None = None,
            hwm: int = DEFAULT_HWM, train: dict | None = None, capture: str = "export",
            use_tuned: bool = True, progress=None) -> str:
    """Profile and return the run id. Runs in a runner process unless model/inputs objects are given.
    capture="dynamo": through torch.compile with the opscope backend, every region's ops recorded.
    progress(steps, events): called a few times a second while a runner runs, with what has arrived.

    Raises UsageError for bad input, RunFailed (a ModelError, with .run_id) when the model fails.
    """
    store = store or RunStore()
    if model is None:
        live = start_profile(model_spec, backend_spec, steps=steps, warmup=warmup, values=values, engine=engine,
                             py_spy=py_spy, config=config, store=store, allow_fallback=allow_fallback,
                             parent_run=parent_run, hwm=hwm, train=train, capture=capture, use_tuned=use_tuned)
        status = live.wait(None if progress is None else 0.2)
        while status == "running":
            progress(live.steps_received, live.events_received)
            status = live.wait(0.2)
        if status not in ("ok", "incomplete"):      # incomplete: the model ran; the run says what is missing
            if live.error_kind == "usage":
                raise UsageError(live.error)
            raise RunFailed(f"run {live.run_id} failed: {live.error}", live.run_id)
        return live.run_id
    return _profile_here(model_spec, backend_spec, steps=steps, warmup=warmup, values=values, engine=engine,
                         py_spy=py_spy, config=config, store=store, model=model, inputs=inputs,
                         allow_fallback=allow_fallback, parent_run=parent_run, train=train, capture=capture)


def _profile_here(model_spec, backend_spec, *, steps, warmup, values, engine, py_spy, config, store, model, inputs,
                  allow_fallback, parent_run, train=None, capture="export") -> str:
    from opscope.runtime import backends
    from .batch import StoreSink
    from .runner import ENGINES, check_capture
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: use {' or '.join(ENGINES)}")
    check_capture(capture, engine, train)
    backend = backends.resolve(backend_spec)
    cfg = {"values": values, "allow_fallback": allow_fallback, "in_process": True, **(config or {})}
    if train is not None:
        cfg["train"] = dict(train)
    if py_spy:
        cfg["py_spy"] = "not sampled: py-spy samples a runner process, and this run ran in-process"
    run_id = store.create_run(model=model_spec or type(model).__name__, backend=backend.name, device=backend.device,
                              engine=engine, description=backend.description.as_dict(), steps=steps, warmup=warmup,
                              config=cfg, parent_run=parent_run)
    sink = StoreSink(store, run_id)
    from .runner import execute

    def on_meta(meta):          # as a runner's run keeps them: placement (fused members, buffer lifetimes), nodes
        keep = {"placement": meta.get("placement"), "nodes": meta.get("nodes")}
        store.update_run(run_id, config={"capture": meta["capture"], **keep} if meta.get("capture") else keep)
    try:
        execute(sink, model_spec=model_spec, backend_spec=backend_spec, steps=steps, warmup=warmup, values=values,
                engine=engine, allow_fallback=allow_fallback, model=model, inputs=inputs, train=train,
                on_train=lambda info: store.update_run(run_id, config={"train": info}), capture=capture,
                on_meta=on_meta)
    except Exception as e:
        from opscope.runtime.errors import OpscopeError
        msg = str(e) if isinstance(e, OpscopeError) else f"{type(e).__name__}: {e}"
        store.finish_run(run_id, status="failed", error=msg)
        if isinstance(e, UsageError):
            raise
        raise RunFailed(f"run {run_id} failed: {msg}", run_id) from e
    from .batch import stored_shortfall
    missing = stored_shortfall(store, run_id, sink.writer.events, 0)
    store.finish_run(run_id, status="incomplete" if missing else "ok", error=missing)
    return run_id
