"""The executor: runs a placed graph node by node, with hooks before and after every op.

    plan = compile_plan(graph, backend)
    ex = Executor(plan)
    outputs = ex.run(*inputs)              # no hooks: a tight loop, no timing at all
    with ex.hooked(MyHook()):
        ex.run(*inputs)                    # hooks see every op, its inputs, outputs and timing

A hook is any object with some of these methods (all optional):

    on_run_start(run: RunInfo)             before the first op of a step
    before_op(call: OpCall)                inputs ready; may block (the debugger pauses here)
    after_op(call: OpCall)                 outputs, start_ns/end_ns (or call.timing on CUDA) set
    on_run_end(run: RunInfo, error)        after the last op, or when an op raised

This is the API the profiler and the debugger build on.

Passes (runtime/passes) run inside compile_plan: `compile_plan(graph, backend, passes=["fuse", "memplan"])`,
or the description's `[passes]` table when `passes` is None; `plan.pass_log` says what they changed and
`plan.memory_plan` the planned peak (with `memplan`, the accounting hooks see follows the planned buffers).

Training carries state across runs on the device: `compile_plan(graph, backend, carry={c: o})`
makes output slot `o` of one run the value of constant slot `c` in the next (new parameters,
optimizer state, batch-norm statistics), with no host round trip (runtime/train builds on it).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ModelError, first_line
from .graph import Graph, Node, Ref
from .graph import materialize as _materialize
from .hdi import Backend
from .placement import Placement, place


@dataclass
class Step:
    """A node bound to the backend that runs it and to its kernel."""

    node: Node
    backend: Backend
    kernel: Callable
    args: tuple
    kwargs: dict
    arg_slots: list                   # [(position, slot)] for flat args; None when nested
    out_slots: list
    free_after: list                  # slots whose last reader is this step
    alloc_bytes: int
    free_bytes: int
    fallback: bool


@dataclass
class OpCall:
    """What a hook sees of one executed op."""

    step: int
    seq: int
    node: Node
    backend: Backend
    inputs: list
    fallback: bool
    outputs: Any = None
    start_ns: int = 0
    end_ns: int = 0
    timing: Any = None                # PendingTiming on CUDA, resolved by the profiler at flush
    live_bytes: int = 0

    @property
    def op(self) -> str:
        return self.node.op


@dataclass
class RunInfo:
    step: int
    plan: "Plan"
    start_ns: int = 0
    end_ns: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class Plan:
    graph: Graph
    backend: Backend
    steps: list[Step]
    placement: Placement
    constants: dict                    # slot -> value on the backend of its readers
    output_refs: list
    carry: dict = field(default_factory=dict)   # constant slot -> output slot that replaces it after a run
    constant_backend: dict = field(default_factory=dict)   # constant slot -> backend holding it
    passes: list = field(default_factory=list)              # pass names run on the graph, in order
    pass_log: list = field(default_factory=list)            # PassLog entries: what each pass changed
    memory_plan: dict | None = None                         # memplan: planned and unplanned peak, reuses

    @property
    def peak_bytes(self) -> int:
        """Peak bytes of live intermediate values over one run (what hooks see as call.live_bytes)."""
        live = peak = 0
        for st in self.steps:
            live += st.alloc_bytes
            peak = max(peak, live)
            live -= st.free_bytes
        return peak

    @property
    def constant_bytes(self) -> int:
        """Parameters, buffers and constants held on the backends for the plan's lifetime."""
        return sum(self.graph.slot_meta[s].nbytes for s in self.constants if s in self.graph.slot_meta)

    @property
    def backends(self) -> list[Backend]:
        seen = {}
        for s in self.steps:
            seen.setdefault(s.backend.name, s.backend)
        return list(seen.values()) or [self.backend]


def compile_plan(graph: Graph, backend: Backend, *, allow_fallback: bool = True, carry: dict | None = None,
                 passes=None, pass_options: dict | None = None) -> Plan:
    """Place `graph` on `backend` and bind kernels. `passes`: names (or "all"/"none") to run first;
    None runs those the backend's description switches on."""
    names, log = [], []
    if passes is not None or getattr(backend.description, "passes", None):
        from . import passes as _passes
        names = _passes.pass_names(passes) if passes is not None else _passes.described(backend.description)
        if names:
            graph, plog = _passes.optimize(graph, backend, names, volatile=set(carry or {}), options=pass_options)
            log = plog.entries
    placement = place(graph, backend, allow_fallback=allow_fallback, volatile=frozenset(carry or ()))
    last_read: dict[int, int] = {}
    for i, (node, _) in enumerate(placement.assignments):
        for s in node.inputs:
            last_read[s] = i
    keep = {r.slot for r in graph.output_refs if isinstance(r, Ref)}
    # Constants go to the backend of their first reader, once per plan (not once per run).
    constants: dict[int, Any] = {}
    constant_backend: dict[int, Backend] = {}
    for node, b in placement.assignments:
        for s in node.inputs:
            if s in graph.constant_slots and s not in constants and graph.constant_slots[s] is not None:
                constants[s] = b.memory.to_device(graph.constant_slots[s])
                constant_backend[s] = b
    free_at: dict[int, list[int]] = {}
    for s, i in last_read.items():
        if s not in keep and s not in graph.constant_slots:
            free_at.setdefault(i, []).append(s)
    from .ops import OPS
    views = {s for node, _ in placement.assignments for s in node.outputs
             if OPS.get(node.op) is not None and OPS[node.op].kind == "view"}
    inputs = set(graph.input_slots)
    steps = []
    for i, (node, b) in enumerate(placement.assignments):
        if node.op == "transfer":
            kernel = _transfer_kernel(node.src_backend, b)
        else:
            kernel = b.prepare(node, b.ops.kernel_for(node))
        flat = [(j, a.slot) for j, a in enumerate(node.args) if isinstance(a, Ref)]
        nested = any(isinstance(a, (list, tuple)) and any(isinstance(x, Ref) for x in a) for a in node.args) or \
            any(_has_ref(v) for v in node.kwargs.values())
        alloc = 0 if node.outputs and node.outputs[0] in views else \
            sum(m.nbytes for m in node.output_meta if m is not None)
        frees = free_at.get(i, [])
        # the caller's inputs were never counted in (alloc is what the plan makes): freeing them must
        # not count out either, or live bytes dip below what is really held and the peak comes out low
        free_bytes = sum(graph.slot_meta[s].nbytes for s in frees
                         if s in graph.slot_meta and s not in views and s not in inputs)
        steps.append(Step(node, b, kernel, node.args, node.kwargs, None if nested else flat, node.outputs, frees,
                          alloc, free_bytes, bool(getattr(node, "fallback", False))))
    plan = Plan(graph, backend, steps, placement, constants, graph.output_refs, dict(carry or {}), constant_backend,
                names, log)
    if "memplan" in names:
        apply_memory_plan(plan)
    return plan


def apply_memory_plan(plan: Plan) -> None:
    """Steps follow the memory plan: outputs written into dying inputs, buffers freed after their last alias."""
    from .passes.memplan import inplace_kernel, plan_memory
    keep = {r.slot for r in plan.graph.output_refs if isinstance(r, Ref)}
    unplanned = plan.peak_bytes
    mp = plan_memory(plan.placement.assignments, plan.graph, keep | set(plan.carry.values()))
    for st, alloc, free, drops, reuse in zip(plan.steps, mp.alloc, mp.free, mp.free_after, mp.reuse):
        st.alloc_bytes, st.free_bytes, st.free_after = alloc, free, drops
        if reuse:
            st.kernel = inplace_kernel(st.kernel, reuse, st.node.multi_output, st.backend.memory.copy)
    plan.memory_plan = {**mp.summary(), "unplanned_peak_bytes": unplanned}


def _has_ref(v) -> bool:
    if isinstance(v, Ref):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_ref(x) for x in v)
    return False


def _transfer_kernel(src: Backend, dst: Backend):
    def transfer(value):
        return dst.memory.to_device(src.memory.to_host(value))
    return transfer


class Executor:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.hooks: list = []
        self.step = 0
        self._env_size = plan.graph.num_slots

    # --- hooks -------------------------------------------------------------------------
    def add_hook(self, hook) -> None:
        self.hooks.append(hook)

    def remove_hook(self, hook) -> None:
        self.hooks.remove(hook)

    @contextlib.contextmanager
    def hooked(self, *hooks):
        for h in hooks:
            self.add_hook(h)
        try:
            yield self
        finally:
            for h in hooks:
                self.remove_hook(h)

    # --- running -----------------------------------------------------------------------
    def _env(self, inputs) -> list:
        plan = self.plan
        if len(inputs) != len(plan.graph.input_slots):
            raise ModelError(f"the model takes {len(plan.graph.input_slots)} inputs, got {len(inputs)}")
        env: list = [None] * self._env_size
        for s, v in plan.constants.items():
            env[s] = v
        for s, v in zip(plan.graph.input_slots, inputs):
            env[s] = plan.backend.memory.to_device(v)
        return env

    def run(self, *inputs) -> list:
        """Run one step; returns the model's outputs as backend values."""
        env = self._env(inputs)
        if self.hooks:
            self._run_hooked(env)
        else:
            self._run_fast(env)
        self.step += 1
        if self.plan.carry:
            self._carry(env)
        return [env[r.slot] if isinstance(r, Ref) else r for r in self.plan.output_refs]

    def _carry(self, env) -> None:
        """Outputs become next run's constants, on the backend that reads them (a copy only
        when placement put the producer and the reader on different backends)."""
        plan = self.plan
        for c, o in plan.carry.items():
            dst = plan.constant_backend.get(c)
            if dst is None:
                continue                      # read by no op: nothing to feed
            value = env[o]
            src = self.holder(o)
            plan.constants[c] = value if src is dst else dst.memory.to_device(src.memory.to_host(value))

    def run_host(self, *inputs) -> list:
        """Run one step; returns the outputs as numpy arrays."""
        outs = self.run(*inputs)
        return [self.holder(r.slot).memory.to_host(o) if isinstance(r, Ref) else o
                for r, o in zip(self.plan.output_refs, outs)]

    def _holder(self, ref) -> Backend:          # the debugger's spelling
        return self.holder(ref.slot)

    def holder(self, slot: int) -> Backend:
        """The backend that holds the value of `slot` (its producer's, or a constant's)."""
        holders = self.__dict__.setdefault("_holders", {})
        if slot not in holders:
            b = self.plan.constant_backend.get(slot)
            for st in reversed(self.plan.steps):
                if slot in st.out_slots:
                    b = st.backend
                    break
            holders[slot] = b or self.plan.backend
        return holders[slot]

    def _call(self, st: Step, env):
        if st.arg_slots is not None:
            args = list(st.args)
            for j, s in st.arg_slots:
                args[j] = env[s]
            kwargs = st.kwargs
        else:
            args = _materialize(st.args, env)
            kwargs = {k: _materialize(v, env) for k, v in st.kwargs.items()}
        return args, kwargs

    def _store(self, st: Step, env, out):
        if st.node.multi_output:
            for s, v in zip(st.out_slots, out):
                env[s] = v
        else:
            env[st.out_slots[0]] = out

    def _run_fast(self, env):
        # NOTE: this loop is the whole cost of opscope with no hooks; keep it free of method
        # calls and attribute lookups. The per-step tuples are rebuilt each run (tens of us) so
        # a caller that swaps a Step's kernel between runs is always honoured.
        for i, (kernel, args, flat, kwargs, multi, out, frees) in enumerate(_fast_steps(self.plan.steps)):
            if flat is not None:
                if flat:
                    args = list(args)
                    for j, s in flat:
                        args[j] = env[s]
            else:
                args = _materialize(args, env)
                kwargs = {k: _materialize(v, env) for k, v in kwargs.items()}
            try:
                value = kernel(*args, **kwargs)
            except Exception as e:
                raise _op_failed(self.plan.steps[i], e) from e
            if multi:
                for s, v in zip(out, value):
                    env[s] = v
            else:
                env[out] = value
            for s in frees:
                env[s] = None

    def _run_hooked(self, env):
        hooks = self.hooks
        before = [h.before_op for h in hooks if hasattr(h, "before_op")]
        after = [h.after_op for h in hooks if hasattr(h, "after_op")]
        step = self.step
        info = RunInfo(step, self.plan, time.perf_counter_ns())
        for h in hooks:
            if hasattr(h, "on_run_start"):
                h.on_run_start(info)
        live = 0
        error = None
        try:
            for seq, st in enumerate(self.plan.steps):
                args, kwargs = self._call(st, env)
                call = OpCall(step, seq, st.node, st.backend, args, st.fallback)
                for f in before:
                    f(call)
                clock = st.backend.clock
                t0 = clock.start(st.node)
                try:
                    out = st.kernel(*args, **kwargs)
                except Exception as e:
                    call.start_ns = call.end_ns = time.perf_counter_ns()
                    raise _op_failed(st, e, call) from e
                t = clock.stop(st.node, t0)
                if type(t) is tuple:
                    call.start_ns, call.end_ns = t
                else:
                    call.timing = t
                live += st.alloc_bytes
                call.live_bytes = live
                call.outputs = out
                self._store(st, env, out)
                for f in after:
                    f(call)
                for s in st.free_after:
                    env[s] = None
                live -= st.free_bytes
        except BaseException as e:  # an op that failed, KeyboardInterrupt, a hook that raised: still end the run
            error = e
            raise
        finally:
            for b in self.plan.backends:
                b.clock.flush()
            info.end_ns = time.perf_counter_ns()
            for h in hooks:
                if hasattr(h, "on_run_end"):
                    h.on_run_end(info, error)


def _fast_steps(steps: list[Step]) -> list[tuple]:
    """(kernel, args, flat arg slots | None when nested, kwargs, multi, out slot(s), frees) per step."""
    out = []
    for st in steps:
        flat = st.arg_slots
        out.append((st.kernel, tuple(st.args) if flat is not None else st.args, flat, st.kwargs,
                    st.node.multi_output or not st.out_slots,
                    list(st.out_slots) if (st.node.multi_output or not st.out_slots) else st.out_slots[0],
                    tuple(st.free_after)))
    return out


class OpFailed(ModelError):
    """An op raised: the message names the op, the node, the module path and the backend."""

    def __init__(self, message, node=None, call=None):
        super().__init__(message)
        self.node = node
        self.call = call


def _op_failed(st: Step, e: Exception, call=None) -> OpFailed:
    n = st.node
    if n.op == "region":                 # a compiler stack raised inside its program: name the region's ops
        from .regions import failure
        return OpFailed(failure(n, st.backend.name, e), n, call)
    where = f" in {n.module_path}" if n.module_path else ""
    return OpFailed(f"op {n.op} (node {n.name}{where}) failed on {st.backend.name}: {type(e).__name__}: {first_line(e)}",
                    n, call)
