"""The stepping controller: runs the model in a worker thread that pauses in the executor's hook.

    ctl = Controller(session, reference="numpy")
    ctl.step(); stop = ctl.wait()          # without a listener, events queue up for wait()
    ctl.cont(); ctl.run_to_nan(); ctl.finish(); ctl.step_into(); ctl.restart(); ctl.quit()

Every stop is *after* an op ran, so the UI shows its inputs and its outputs. Commands never
block the caller: they set what to run to and release the paused worker. The worker posts one
event per stop (Stop), per end of run (Finished) and per failure (Failed).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from opscope.runtime.graph import Ref

from . import debugpy as _debugpy
from .breakpoints import STATS, Breakpoint, Breakpoints
from .lockstep import Lockstep, OpDiff
from .stats import TensorStats, fmt, has_nonfinite, summarize, to_host
from .watches import Watches


class _Abort(BaseException):
    """Unwinds a paused run on restart/quit (not an error of the model)."""


@dataclass
class Stop:
    seq: int
    step: int
    node: object
    backend: str
    device: str
    reason: str
    inputs: list             # [(label, host array or python value)]
    outputs: list
    input_stats: list[TensorStats]
    output_stats: list[TensorStats]
    seconds: float | None
    simulated: bool
    diff: OpDiff | None = None
    breakpoint: Breakpoint | None = None
    nan_origin: str = ""
    fallback: bool = False


@dataclass
class Finished:
    step: int
    outputs: list[TensorStats]
    ops: int


@dataclass
class Failed:
    message: str
    node: object = None
    seq: int | None = None
    input_stats: list = field(default_factory=list)
    inputs: list = field(default_factory=list)        # [(label, host array)] of the failing op


_NONFINITE = frozenset(("nan", "inf"))


def _in_module(path: str, module: str) -> bool:
    return not module or path == module or path.startswith(module + ".")


def _labels(args, prefix="in"):
    """(label, template position) for every Ref in the node's args, in order."""
    out = []
    for j, a in enumerate(args):
        if isinstance(a, Ref):
            out.append((f"{prefix}{j}", (j,)))
        elif isinstance(a, (list, tuple)):
            for k, x in enumerate(a):
                if isinstance(x, Ref):
                    out.append((f"{prefix}{j}[{k}]", (j, k)))
    return out


def _pick(values, pos):
    v = values[pos[0]]
    return v[pos[1]] if len(pos) > 1 else v


def nan_origin(inputs: list, outputs: list) -> str:
    """Which input put the first NaN/Inf into the output: inherited, or made here (and from what)."""
    for label, a in inputs:
        nan, inf = has_nonfinite(a)
        if nan or inf:
            return f"{label} already holds {'NaN' if nan else 'Inf'}: inherited from an earlier op"
    for label, out in outputs:
        if not (isinstance(out, np.ndarray) and out.dtype.kind == "f"):
            continue
        bad = ~np.isfinite(out)
        if not bad.any():
            continue
        flat = int(np.argmax(bad.reshape(-1)))
        idx = np.unravel_index(flat, out.shape) if out.ndim else ()
        where = ", ".join(map(str, idx))
        parts = []
        for lab, a in inputs:
            if isinstance(a, np.ndarray):
                try:
                    parts.append(f"{lab}[{where}] = {fmt(float(np.broadcast_to(a, out.shape)[idx]))}")
                except ValueError:      # not elementwise with the output: no single source element
                    pass
        src = (" from " + ", ".join(parts)) if parts else ""
        return f"introduced here: {label}[{where}] = {out[idx]}{src} (the inputs are finite)"
    return ""


class Controller:
    """One controller per session at a time: its hook sits in the session's executor while it runs."""

    def __init__(self, session, *, reference: str | None = None, tolerance: float | None = None,
                 breakpoints=(), break_on_nan: bool = False, listener=None, use_debugpy: bool = False):
        self.session = session
        self.plan = session.plan
        self.steps = self.plan.steps
        self.breakpoints = Breakpoints()
        for spec in breakpoints:
            self.breakpoints.add(spec)
        if break_on_nan:
            self.breakpoints.add("nan")
            self.breakpoints.add("inf")
        self.watches = Watches()
        self.lockstep = Lockstep(self.plan, session.inputs, reference, tolerance) if reference else None
        if self.lockstep is not None:
            tol = "per dtype" if tolerance is None else fmt(tolerance)
            self.breakpoints.add(Breakpoint(spec=f"tolerance ({tol})", cond="tolerance", builtin=True))
        self.listener = listener
        self.use_debugpy = use_debugpy
        self.events: queue.Queue = queue.Queue()
        self.state = "idle"              # idle | running | paused | finished | failed | quit
        self.current: Stop | None = None
        self.last_error: Failed | None = None
        self._mode: tuple = ("next",)
        self._resume = threading.Event()
        self._wake = threading.Event()
        self._abort = False
        self._restart = False
        self._quit = False
        self._thread: threading.Thread | None = None
        self.runs = 0
        # one record per op that ran (the advisor pane's input): this run's, and the last whole run's
        self.seen: list[tuple] = []
        self.last_run: list[tuple] = []
        self._stats_cache: dict = {}     # id(host array) -> (array, stats) of the last stop's outputs

    # --- commands (called from the UI thread; never block) -------------------------------
    def step(self) -> bool:
        return self._go(("next",))

    def step_into(self) -> bool:
        """Run to the next module: stop in the first op whose module differs from this one."""
        cur = self.current.node.module_path if self.current else None
        return self._go(("enter", cur))

    def finish(self) -> bool:
        """Run to the end of the current module (its last op); again, and the parent's."""
        if not self.current:
            return self._go(("next",))
        return self._go(("until", self._module_end(self.current.seq)))

    def cont(self) -> bool:
        return self._go(("continue",))

    def run_to_nan(self) -> bool:
        return self._go(("nan",))

    def restart(self) -> None:
        self._mode = ("next",)
        if self.state in ("idle",):
            self._start()
            return
        self._restart = True
        self._abort = True
        self.state = "running"
        self._resume.set()
        self._wake.set()

    def quit(self, timeout: float = 5.0) -> None:
        self._quit = True
        self._abort = True
        self._resume.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.state = "quit"

    def wait(self, timeout: float = 60.0):
        """The next event (without a listener): Stop, Finished or Failed."""
        return self.events.get(timeout=timeout)

    def _go(self, mode: tuple) -> bool:
        if self.state == "idle":
            self._mode = mode
            self._start()
            return True
        if self.state != "paused":
            return False       # running (busy), finished or failed: the UI says what to do
        self._mode = mode
        self.state = "running"
        self._resume.set()
        return True

    def _start(self) -> None:
        self.state = "running"
        self._thread = threading.Thread(target=self._worker, name="opscope-debug-model", daemon=True)
        self._thread.start()

    # --- navigation ----------------------------------------------------------------------
    def _module_end(self, i: int) -> int:
        m = self.steps[i].node.module_path
        n = len(self.steps)
        while True:
            j = i
            while j + 1 < n and _in_module(self.steps[j + 1].node.module_path, m):
                j += 1
            if j > i or not m:
                return j
            m = m.rsplit(".", 1)[0] if "." in m else ""

    # --- the worker ----------------------------------------------------------------------
    def _emit(self, event) -> None:
        if self.listener is not None:
            self.listener(event)
        else:
            self.events.put(event)

    def _worker(self) -> None:
        try:
            self._loop()
        except BaseException as e:     # a bug of ours: say so in the UI rather than hang it
            if not isinstance(e, _Abort):
                self.state = "failed"
                self._emit(Failed(f"debugger error: {type(e).__name__}: {e}"))

    def _loop(self) -> None:
        while True:
            self._abort = False
            self._restart = False
            self._run_once()
            if self._quit:
                return
            if self._restart:
                continue
            self._wake.wait()
            self._wake.clear()
            if self._quit:
                return
            self._mode = ("next",)

    def _run_once(self) -> None:
        ex = self.session.executor
        self.runs += 1
        self.current = None
        self.seen = []
        self._stats_cache = {}
        if self.lockstep is not None:
            self.lockstep.start()
        try:
            with ex.hooked(self):
                outs = ex.run(*self.session.inputs)
        except _Abort:
            return
        except Exception as e:       # OpFailed (a ModelError) or anything the model raised
            if self._abort:
                return
            node = getattr(e, "node", None)
            call = getattr(e, "call", None)
            values = []
            if call is not None and node is not None:
                values = [(lab, to_host(_pick(call.inputs, pos), call.backend)) for lab, pos in _labels(node.args)]
            ins = [summarize(lab, a, call.backend.device) for lab, a in values]
            self.last_error = Failed(str(e) or type(e).__name__, node, call.seq if call is not None else
                                     (node.index if node is not None else None), ins, values)
            self.state = "failed"
            self._emit(self.last_error)
            return
        stats = []
        for i, (r, o) in enumerate(zip(self.plan.output_refs, outs)):
            if isinstance(r, Ref):
                stats.append(summarize(f"output{i}", to_host(o, ex._holder(r))))
        self.last_run = self.seen
        self.state = "finished"
        self._emit(Finished(ex.step - 1, stats, len(self.steps)))

    # --- executor hooks (worker thread) --------------------------------------------------
    def before_op(self, call) -> None:
        if self._abort:
            raise _Abort()
        if self.use_debugpy and any(bp.enabled and bp.cond is None and bp.matches_place(call.node)
                                    for bp in self.breakpoints):
            _debugpy.breakpoint_if_attached()     # step into the kernel's Python in VS Code

    def after_op(self, call) -> None:
        if self._abort:
            raise _Abort()
        node = call.node
        self.seen.append((call.step, call.seq, call.start_ns, call.end_ns, call.timing, call.live_bytes,
                          call.backend.name, bool(call.fallback)))
        needs = self.breakpoints.needs()
        mode = self._mode[0]
        outs = call.outputs if node.multi_output else [call.outputs]
        host_outs = None
        diff = None
        if self.lockstep is not None:
            host_outs = [to_host(o, call.backend) for o in outs]
            diff = self.lockstep.after_op(call, host_outs)
        facts = {}
        if needs or mode == "nan":
            host_outs = host_outs or [to_host(o, call.backend) for o in outs]
            if needs & _NONFINITE or mode == "nan":
                flags = [has_nonfinite(a) for a in host_outs]
                facts["nan"] = any(f[0] for f in flags)
                facts["inf"] = any(f[1] for f in flags)
            if needs & STATS:
                first = next((a for a in host_outs if isinstance(a, np.ndarray)), None)
                if first is not None:
                    s = summarize("out", first)
                    facts.update(max_abs=s.max_abs, min=s.min, max=s.max, mean=s.mean, std=s.std)
            if diff is not None:
                facts.update(err=diff.err, local=diff.local, tolerance=diff.introduced)
        bp = self.breakpoints.hit(node, facts) if self.breakpoints.items else None
        reason = ""
        if bp is not None:
            reason = f"breakpoint {bp.describe()}"
        elif mode == "next":
            reason = "step"
        elif mode == "until" and call.seq >= self._mode[1]:
            reason = "end of module"
        elif mode == "enter" and node.module_path != self._mode[1]:
            reason = f"entered {node.module_path or 'the model'}"
        elif mode == "nan" and (facts.get("nan") or facts.get("inf")):
            reason = "first NaN" if facts.get("nan") else "first Inf"
        if not reason:
            return
        self._pause(call, reason, bp, diff, host_outs, outs)

    def _pause(self, call, reason, bp, diff, host_outs, outs) -> None:
        node = call.node
        b = call.backend
        host_outs = host_outs or [to_host(o, b) for o in outs]
        out_labels = ["out"] if not node.multi_output else [f"out{i}" for i in range(len(outs))]
        inputs = [(lab, to_host(_pick(call.inputs, pos), b)) for lab, pos in _labels(node.args)]
        outputs = [(lab, a if a is not None else o) for lab, a, o in zip(out_labels, host_outs, outs)]
        seconds = op_seconds(call.start_ns, call.end_ns, call.timing)
        out_stats = [summarize(lab, a if isinstance(a, np.ndarray) else o, b.device)
                     for (lab, a), o in zip(outputs, outs)]
        stop = Stop(call.seq, call.step, node, b.name, b.device, reason, inputs, outputs,
                    self._input_stats(inputs, outputs, b.device), out_stats,
                    seconds, bool(getattr(b.clock, "simulated", False)), diff, bp, fallback=call.fallback)
        # the next op's input is usually this op's output: keep its stats instead of recomputing them
        self._stats_cache = {id(a): (a, st) for (_, a), st in zip(outputs, out_stats) if isinstance(a, np.ndarray)}
        if reason.startswith("first") or (bp is not None and bp.cond in ("nan", "inf")) or \
                any(s.nan or s.inf for s in stop.output_stats):
            stop.nan_origin = nan_origin(inputs, outputs)
        self.update_watches(stop)
        self.current = stop
        self.state = "paused"
        self._resume.clear()
        self._emit(stop)
        self._resume.wait()
        if self._abort:
            raise _Abort()

    def _input_stats(self, inputs, outputs, device) -> list:
        written = {id(a) for _, a in outputs}       # an op that wrote into its input: recompute
        stats = []
        for lab, a in inputs:
            hit = self._stats_cache.get(id(a))
            if hit is not None and hit[0] is a and id(a) not in written:
                stats.append(replace(hit[1], name=lab, device=device))
            else:
                stats.append(summarize(lab, a, device))
        return stats

    def update_watches(self, stop: Stop) -> None:
        outs = [a for _, a in stop.outputs]
        ins = [a for _, a in stop.inputs]
        self.watches.update(f"{stop.seq}:{stop.node.name}", outs[0] if outs else None, outs, ins)

    def add_watch(self, expr: str):
        w = self.watches.add(expr)
        if self.current is not None and self.state == "paused":
            saved, self.watches.items = self.watches.items, [w]
            try:
                self.update_watches(self.current)
            finally:
                self.watches.items = saved
        return w


def op_seconds(start_ns: int, end_ns: int, timing=None) -> float | None:
    """An op's duration: the clock's (start, end), or a CUDA event pair (the debugger has synced)."""
    if end_ns:
        return (end_ns - start_ns) / 1e9
    if timing is not None and hasattr(timing, "start") and hasattr(timing, "end"):
        try:
            timing.end.synchronize()
            return timing.start.elapsed_time(timing.end) / 1e3
        except Exception:       # an event that never ran (a failed op): no time rather than a wrong one
            return None
    return None


def time_per_step(ctl: Controller, n: int) -> float:
    """Seconds per `n` (step + wait) round trip; for the benchmark."""
    t0 = time.perf_counter()
    for _ in range(n):
        ctl.step()
        ev = ctl.wait()
        if not isinstance(ev, Stop):
            break
    return (time.perf_counter() - t0) / n
