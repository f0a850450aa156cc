"""The stepping controller: runs the model in a worker thread that pauses in the executor's hook.

    ctl = Controller(session, reference="numpy")
    ctl.step(); stop = ctl.wait()          # without a listener, events queue up for wait()
    ctl.cont(); ctl.run_to_nan(); ctl.finish(); ctl.step_into(); ctl.restart(); ctl.quit()
    ctl.history_stop(i)                    # op i of this run as it was (values within --history-mb)
    ctl.report                             # with a reference: one accuracy row per op run so far
    Controller(open_train_session(...))    # a run is a training step: stops say their phase (debugger/train.py)
    Controller(open_dynamo_session(...))   # torch.compile: every region's ops, numbered one after another

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
from .history import History, Record
from .lockstep import Lockstep, OpDiff
from .pystack import user_frames
from .report import AccuracyReport
from .stats import TensorStats, fmt, has_nonfinite, nan_origin, op_seconds, summarize, to_host
from .train import NamedWatches, backward_of, grad_value, graph_index


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
    stack: list = field(default_factory=list)     # [pystack.Frame], innermost first, internals hidden
    history: str = ""        # set when this is a look back: "op 3 of 12 run so far"
    dropped: bool = False    # a look back past the history budget: stats kept, values not
    time_note: str = ""      # why the time is not the clock's (paused in debugpy: re-timed)
    phase: str = ""          # training: forward | backward | optimizer
    backward_of: str = ""    # a backward op: the forward op it differentiates and what that read
    locals: list = field(default_factory=list)    # [(name, summary)] of the op's frame as it was traced
    computed_dtype: str = ""  # the dtype the backend computes in when it is not the graph's (a chip's low_precision)


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


_NONFINITE = frozenset(("nan", "inf", "new-nan"))
HISTORY_MB = 256


def _in_module(path: str, module: str) -> bool:
    return not module or path == module or path.startswith(module + ".")


def _ref_positions(args):
    """(template position, slot) for every Ref in the node's args, in order."""
    out = []
    for j, a in enumerate(args):
        if isinstance(a, Ref):
            out.append(((j,), a.slot))
        elif isinstance(a, (list, tuple)):
            for k, x in enumerate(a):
                if isinstance(x, Ref):
                    out.append(((j, k), x.slot))
    return out


def _pick(values, pos):
    v = values[pos[0]]
    return v[pos[1]] if len(pos) > 1 else v


def parameter_names(session, plan=None) -> dict[int, str]:
    """Constant slot -> the parameter or buffer it is (`h.0.attn.c_attn.weight`), by storage identity
    (a training session names its slots itself: its parameters are copies, and optimizer state)."""
    if "slot_names" in getattr(session, "extra", {}):
        return dict(session.extra["slot_names"])
    named = {}
    model = getattr(session, "model", None)
    if model is not None:
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            named.setdefault(t.data_ptr(), name)
    out = {}
    for s, v in (plan or session.plan).graph.constant_slots.items():
        if v is not None and hasattr(v, "data_ptr"):
            out[s] = named.get(v.data_ptr(), "a constant")
    return out


class Controller:
    """One controller per session at a time: its hook sits in the session's executor while it runs."""

    def __init__(self, session, *, reference: str | None = None, tolerance: float | None = None,
                 breakpoints=(), break_on_nan: bool = False, listener=None, use_debugpy: bool = False,
                 history_mb: float = HISTORY_MB):
        self.session = session
        # A torch.compile session runs one plan per region (a graph break starts a new one): the
        # controller numbers their ops one after another, and each hook's run says which is running.
        dynamo = getattr(session, "dynamo", None)
        self.plans = list(dynamo.plans) if dynamo is not None else [session.plan]
        self.regions = dynamo is not None
        self._offsets = {}
        self.steps = []
        for plan in self.plans:
            self._offsets[id(plan)] = len(self.steps)
            self.steps.extend(plan.steps)
        self.plan = self.plans[0]
        self._base = 0                   # global number of the running plan's first op
        self.breakpoints = Breakpoints()
        for spec in breakpoints:
            self.breakpoints.add(spec)
        if break_on_nan:
            self.breakpoints.add(Breakpoint(spec="NaN/Inf made by an op", cond="new-nan", builtin=True))
        self.watches = NamedWatches()
        self.training = bool(getattr(session, "extra", {}).get("train"))
        self._grad_of = getattr(session, "extra", {}).get("grad_of", {})    # slot -> parameter whose gradient it is
        self._index = graph_index(self.plan) if self.training else ({}, {})
        self._locksteps: dict = {}       # plan id -> its Lockstep (one per region)
        if reference:
            self._locksteps[id(self.plan)] = Lockstep(self.plan, None if self.regions else session.inputs,
                                                      reference, tolerance)
        self.lockstep = self._locksteps.get(id(self.plan))
        self._reference = (reference, tolerance)
        if self.lockstep is not None:
            tol = "per dtype" if tolerance is None else fmt(tolerance)
            self.breakpoints.add(Breakpoint(spec=f"tolerance ({tol})", cond="tolerance", builtin=True))
        self.report = AccuracyReport(session.spec, session.backend.name, reference or "",
                                     "per dtype" if tolerance is None else repr(tolerance))
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
        self.history = History(int(history_mb * (1 << 20)))
        self.progress = (0, 0.0)         # (ops run in this command, perf_counter when it began)
        # which slots are parameters/buffers (named) and model inputs: a NaN there is no op's doing
        self._per_plan: dict = {}        # plan id -> (constant slot -> name, input slot -> number)
        self.param_names, self._inputs = self._names_of(self.plan)
        self._counted = {}               # id(node) -> bytes of its values history counts
        self._labels = {}                # id(node) -> [(label, position, slot)]
        self._stacks = getattr(session, "extra", {}).get("stacks", {})
        self._locals = getattr(session, "extra", {}).get("locals", {})
        self._bad: dict[int, bool] = {}  # slot -> holds NaN/Inf (op outputs checked this run)
        self.first_nan: tuple | None = None   # (seq, node name) of the first op that made a NaN/Inf

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

    def interrupt(self) -> bool:
        """Ctrl-C while the model runs (a continue, a finish): stop after the op that is running, as
        pdb and gdb do. False when nothing runs (the UI then quits)."""
        if self.state != "running":
            return False
        self._mode = ("interrupt",)         # read by the worker after its current op
        return True

    def run_to_nan(self) -> bool:
        """Run to the next op that *makes* a NaN/Inf (from finite inputs, or from a parameter)."""
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
        self.progress = (0, time.perf_counter())
        self.state = "running"
        self._resume.set()
        return True

    def _start(self) -> None:
        self.state = "running"
        self.progress = (0, time.perf_counter())
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
            self._wake.clear()      # a restart from a pause set it too: it must not start a run after this one
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
        self.runs += 1
        self.current = None
        self.seen = []
        self._stats_cache = {}
        self._bad = {}
        self.first_nan = None
        self.history.clear()
        self.report.rows = []
        self.report.complete = False
        for lock in self._locksteps.values():
            lock.start()
        try:
            outs = self._run_model()
        except _Abort:
            return
        except Exception as e:       # OpFailed (a ModelError) or anything the model raised
            if self._abort:
                return
            node = getattr(e, "node", None)
            call = getattr(e, "call", None)
            values = []
            if call is not None and node is not None:
                values = [(lab, to_host(_pick(call.inputs, pos), call.backend)) for lab, pos, _ in self.labels(node)]
            ins = [summarize(lab, a, call.backend.device) for lab, a in values]
            self.last_error = Failed(str(e) or type(e).__name__, node, self._base + call.seq if call is not None
                                     else (node.index if node is not None else None), ins, values)
            self.state = "failed"
            self._emit(self.last_error)
            return
        for lock in self._locksteps.values():
            lock.finish()
        stats = [summarize(f"output{i}", o) for i, o in enumerate(outs)]
        self.last_run = self.seen
        self.report.complete = True
        self.state = "finished"
        self._emit(Finished(self.runs - 1 if self.regions else self.session.executor.step - 1, stats, len(self.steps)))

    def _run_model(self) -> list:
        """One run (a forward pass, a training step, or the compiled model's call), outputs on the host."""
        if self.regions:
            with self.session.hooked(self):
                return [np.asarray(o) for o in self.session.run()]
        ex = self.session.executor
        with ex.hooked(self):
            outs = ex.run(*self.session.inputs)
        return [to_host(o, ex._holder(r)) for r, o in zip(self.plan.output_refs, outs) if isinstance(r, Ref)]

    def tree_path(self, seq: int) -> str:
        """Where op `seq` sits in the graph tree: its module, under its phase (training) or its
        region (torch.compile), so a step reads in the order it runs."""
        node = self.steps[seq].node
        top = ""
        if self.training:
            top = node.attrs.get("phase", "forward")
        elif self.regions:
            top = f"region {max(i for i, p in enumerate(self.plans) if self._offsets[id(p)] <= seq)}"
        return f"{top}.{node.module_path}" if top and node.module_path else (top or node.module_path)

    # --- which plan is running ---------------------------------------------------------------
    def on_run_start(self, info) -> None:
        """A plan starts (every run; once per region call with torch.compile): its ops' numbers,
        names and reference follow."""
        plan = info.plan
        if plan is self.plan and not self.regions:
            return
        if id(plan) not in self._offsets:        # a region compiled for new shapes while debugging
            self._offsets[id(plan)] = len(self.steps)
            self.plans.append(plan)
            self.steps.extend(plan.steps)
        self.plan = plan
        self._base = self._offsets[id(plan)]
        self.param_names, self._inputs = self._names_of(plan)
        self._bad = {}                           # slots are numbered per plan
        if self._reference[0]:
            lock = self._locksteps.get(id(plan))
            if lock is None:
                lock = self._locksteps[id(plan)] = Lockstep(plan, None, *self._reference)
            lock.start()
            self.lockstep = lock

    def _names_of(self, plan) -> tuple[dict, dict]:
        got = self._per_plan.get(id(plan))
        if got is None:
            got = self._per_plan[id(plan)] = (parameter_names(self.session, plan),
                                              {s: i for i, s in enumerate(plan.graph.input_slots)})
        return got

    # --- what an op's values are called ------------------------------------------------------
    def labels(self, node) -> list:
        """[(label, template position, slot)]: `in1 fc.weight` for a parameter, `in0` otherwise."""
        got = self._labels.get(id(node))
        if got is None:
            got = []
            for pos, slot in _ref_positions(node.args):
                lab = f"in{pos[0]}" if len(pos) == 1 else f"in{pos[0]}[{pos[1]}]"
                if slot in self.param_names:
                    lab += f" {self.param_names[slot]}"
                got.append((lab, pos, slot))
            self._labels[id(node)] = got
        return got

    def _history_bytes(self, node) -> int:
        n = self._counted.get(id(node))
        if n is None:
            meta = self.plan.graph.slot_meta
            n = sum(m.nbytes for m in node.output_meta if m is not None)
            n += sum(meta[s].nbytes for s in node.inputs if s in meta and s not in self.param_names)
            self._counted[id(node)] = n
        return n

    # --- executor hooks (worker thread) --------------------------------------------------
    def before_op(self, call) -> None:
        if self._abort:
            raise _Abort()
        if self.use_debugpy and any(bp.enabled and bp.cond is None and bp.matches_place(call.node)
                                    for bp in self.breakpoints):
            # stop in a frame at the op's own line in the user's file, its tensors as locals;
            # before the op's clock starts, so time paused in the IDE is not the op's time
            values = {lab.split()[0].replace("[", "_").replace("]", ""): to_host(_pick(call.inputs, pos), call.backend)
                      for lab, pos, _ in self.labels(call.node)}
            frame = self.stack_of(call.node)
            _debugpy.break_at(frame[0] if frame else None, values)

    def stack_of(self, node) -> list:
        return user_frames(self._stacks.get(node.name, []))

    def after_op(self, call) -> None:
        if self._abort:
            raise _Abort()
        node = call.node
        seq = self._base + call.seq
        self.seen.append((call.step, seq, call.start_ns, call.end_ns, call.timing, call.live_bytes,
                          call.backend.name, bool(call.fallback)))
        self.progress = (self.progress[0] + 1, self.progress[1])
        needs = self.breakpoints.needs()
        mode = self._mode[0]
        outs = call.outputs if node.multi_output else [call.outputs]
        host_outs = None
        diff = None
        if self.lockstep is not None:
            host_outs = [to_host(o, call.backend) for o in outs]
            diff = self.lockstep.after_op(call, host_outs)
            self.report.record(node, diff, seq, self.lockstep)
        rec = None
        if self.history.budget:
            rec = Record(seq, call.step, call, diff, self._history_bytes(node))
            self.history.add(rec)
        facts = {}
        if needs or mode == "nan":
            host_outs = host_outs or [to_host(o, call.backend) for o in outs]
            if needs & _NONFINITE or mode == "nan":
                flags = [has_nonfinite(a) for a in host_outs]
                facts["nan"] = any(f[0] for f in flags)
                facts["inf"] = any(f[1] for f in flags)
                bad = facts["nan"] or facts["inf"]
                for s in node.outputs:
                    self._bad[s] = bad
                if bad:
                    facts["new-nan"] = self._makes_nonfinite(call)
                    if facts["new-nan"] and self.first_nan is None:
                        self.first_nan = (seq, node.name)
            if needs & STATS:
                first = next((a for a in host_outs if isinstance(a, np.ndarray)), None)
                if first is not None:
                    s = summarize("out", first)
                    facts.update(max_abs=s.max_abs, min=s.min, max=s.max, mean=s.mean, std=s.std)
            if diff is not None:
                facts.update(err=diff.err, local=diff.local, tolerance=diff.introduced, introduced=diff.significant)
        bp = self.breakpoints.hit(node, facts) if self.breakpoints.items else None
        reason = ""
        if bp is not None:
            reason = f"breakpoint {bp.describe()}"
        elif mode == "next":
            reason = "step"
        elif mode == "until" and seq >= self._mode[1]:
            reason = "end of module"
        elif mode == "enter" and node.module_path != self._mode[1]:
            reason = f"entered {node.module_path or 'the model'}"
        elif mode == "nan" and facts.get("new-nan"):
            reason = "NaN made here" if facts.get("nan") else "Inf made here"
        elif mode == "interrupt":
            reason = "interrupted (Ctrl-C; Ctrl-C again quits)"
        if not reason:
            return
        self._pause(call, reason, bp, diff, host_outs, outs, rec, seq)

    def _input_bad(self, call, pos, slot) -> bool:
        known = self._bad.get(slot)
        if known is None:
            known = any(has_nonfinite(to_host(_pick(call.inputs, pos), call.backend)))
            self._bad[slot] = known
        return known

    def _makes_nonfinite(self, call) -> bool:
        """Its output holds NaN/Inf and no input that an earlier op made does: this op (or a
        parameter / model input it reads) is where they come from."""
        for _, pos, slot in self.labels(call.node):
            if slot in self.param_names or slot in self._inputs:
                continue
            if self._input_bad(call, pos, slot):
                return False
        return True

    def make_stop(self, call, reason, bp=None, diff=None, host_outs=None, outs=None, seq=None) -> Stop:
        """What the UI shows of an op that ran (for a pause, or for a look back in history)."""
        node = call.node
        b = call.backend
        if outs is None:
            outs = call.outputs if node.multi_output else [call.outputs]
        host_outs = host_outs or [to_host(o, b) for o in outs]
        out_labels = ["out"] if not node.multi_output else [f"out{i}" for i in range(len(outs))]
        if self._grad_of:       # a gradient of a parameter says whose
            out_labels = [f"{lab} grad {self._grad_of[s]}" if s in self._grad_of else lab
                          for lab, s in zip(out_labels, node.outputs)]
        inputs = [(lab, to_host(_pick(call.inputs, pos), b)) for lab, pos, _ in self.labels(node)]
        outputs = [(lab, a if a is not None else o) for lab, a, o in zip(out_labels, host_outs, outs)]
        seconds = op_seconds(call.start_ns, call.end_ns, call.timing)
        out_stats = [summarize(lab, a if isinstance(a, np.ndarray) else o, b.device)
                     for (lab, a), o in zip(outputs, outs)]
        stop = Stop(self._base + call.seq if seq is None else seq, call.step, node, b.name, b.device, reason, inputs, outputs,
                    self._input_stats(inputs, outputs, b.device), out_stats,
                    seconds, bool(getattr(b.clock, "simulated", False)), diff, bp, fallback=call.fallback,
                    stack=self.stack_of(node), locals=self._locals.get(node.name, []))
        desc = getattr(b, "description", None)
        if desc is not None and node.op in getattr(desc, "low_precision", ()):
            stop.computed_dtype = "float16"     # sim_backend._low_precision: in float16, cast back
        if self.training:
            stop.phase = node.attrs.get("phase", "forward")
            stop.backward_of = backward_of(node, *self._index, self.labels)
        if any(s.nan or s.inf for s in stop.output_stats):
            stop.nan_origin = self.nan_origin(call, inputs, outputs)
        return stop

    def _pause(self, call, reason, bp, diff, host_outs, outs, rec=None, seq=None) -> None:
        stop = self.make_stop(call, reason, bp, diff, host_outs, outs, seq)
        if rec is not None:
            rec.stop = stop
        # the next op's input is usually this op's output: keep its stats instead of recomputing them
        self._stats_cache = {id(a): (a, st) for (_, a), st in zip(stop.outputs, stop.output_stats)
                             if isinstance(a, np.ndarray)}
        self.update_watches(stop)
        self.current = stop
        self.state = "paused"
        self._resume.clear()
        self._emit(stop)
        self._resume.wait()
        if self._abort:
            raise _Abort()

    def history_stop(self, index: int) -> Stop:
        """Record `index` of this run's history as a Stop (made once, kept with the record)."""
        rec = self.history[index]
        back = len(self.history) - 1 - index
        where = f"looking back: op #{rec.seq + 1}, {back} op{'s' if back != 1 else ''} before the current one"
        if rec.stop is None:
            if rec.call is None:
                node = self.steps[rec.seq].node
                rec.stop = Stop(rec.seq, rec.step, node, self.steps[rec.seq].backend.name,
                                self.steps[rec.seq].backend.device, "history", [], [], [], [], None, False,
                                rec.diff, stack=self.stack_of(node), dropped=True)
            else:
                rec.stop = self.make_stop(rec.call, "history", diff=rec.diff, seq=rec.seq)
        return replace(rec.stop, history=where)

    def nan_origin(self, call, inputs: list, outputs: list) -> str:
        """Which input put the first NaN/Inf into the output: a parameter, an earlier op, or made here."""
        for (label, a), (_, pos, slot) in zip(inputs, self.labels(call.node)):
            nan, inf = has_nonfinite(a)
            if not (nan or inf):
                continue
            what = "NaN" if nan else "Inf"
            if slot in self.param_names:
                return (f"{label.split()[0]} is parameter {self.param_names[slot]}, which holds {what}: "
                        "the weights carry it, no op made it")
            if slot in self._inputs:
                return f"{label} is model input {self._inputs[slot]}, which holds {what}: the input carries it"
            first = f" (first made by #{self.first_nan[0] + 1} {self.first_nan[1]})" if self.first_nan else ""
            return f"{label} already holds {what}: inherited from an earlier op{first}"
        return nan_origin(inputs, outputs)

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
        if self.training:
            self.watches.names["grad"] = grad_value(stop.node, stop.inputs, stop.outputs)
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


def time_per_step(ctl: Controller, n: int) -> float:
    """Seconds per `n` (step + wait) round trip; for the benchmark."""
    t0 = time.perf_counter()
    for _ in range(n):
        ctl.step()
        ev = ctl.wait()
        if not isinstance(ev, Stop):
            break
    return (time.perf_counter() - t0) / n
