"""The graph engine's recorder: an executor hook that turns every OpCall into an event.

    rec = Recorder(sink, values=False)
    with session.executor.hooked(rec):
        session.run()

The hot path appends one small tuple per op; everything static about an op (names, shapes,
FLOPs, bytes) is computed once per plan as a *site* (see batch.py). On CUDA the executor hands
over PendingTimings; they are resolved once per step against one anchor event.

torch.compile (runtime/dynamo.py) runs a step as many region runs, each with its own plan and
`call.seq` from 0; there the caller ends steps:

    rec = Recorder(sink, regions=True)
    with session.hooked(rec):              # a DynamoSession: every region's executor
        session.run(); rec.end_step()

Sites are keyed by plan (each plan gets a block of site ids), event seqs count on across the
step's region runs, and node names carry their region (`region2.backward/mm`), so two regions'
`addmm` stay apart and a backward node names its forward node in the same terms.

A region a compiler stack ran (runtime/regions.py) is one event; its stack's own profile adds a child
event per op span beneath it (depth 1, `parent` the region's node, `clock` the stack's profiler), with
the opscope ops and nodes it covers, their module path and FLOPs. Child seqs follow the plan's.
"""
from __future__ import annotations

import re
import threading
import time

import numpy as np

from opscope.runtime.regions import RegionProfile

from .batch import Batch, shapes_json
from .summaries import summarize

FLUSH_EVENTS = 4096
FLUSH_INTERVAL_NS = 100_000_000   # a live view sees events at least this often on a slow model


_REGION = re.compile(r"region (\d+) (inference|forward|backward)$")


def region_prefix(model_name: str, kind: str | None = None) -> str:
    """`Net region 2 backward` -> `region2.backward/` (`region2/` for an inference graph); `kind`
    names another graph of the same region (a backward node's forward node lives in `forward`)."""
    m = _REGION.search(model_name)
    if m is None:
        return f"{model_name}/" if model_name else ""
    kind = kind or m.group(2)
    return f"region{m.group(1)}/" if kind == "inference" else f"region{m.group(1)}.{kind}/"


def plan_sites(plan, base: int = 0, region: bool = False) -> list[tuple]:
    """One site per plan step (site id = base + seq); with `region`, node names carry the region."""
    from opscope.runtime.train.joint import forward_of, phase_of
    name = plan.graph.model_name
    prefix = region_prefix(name) if region else ""
    fwd_prefix = region_prefix(name, "forward") if region else ""
    sites = []
    phases = [phase_of(st.node) for st in plan.steps]
    for seq in range(len(phases) - 2, -1, -1):   # a transfer the placement inserted: its consumer's phase
        if plan.steps[seq].node.op == "transfer":
            phases[seq] = phases[seq + 1]
    for seq, st in enumerate(plan.steps):
        n = st.node
        ish, idt = shapes_json(n.input_meta)
        osh, odt = shapes_json(n.output_meta)
        try:
            flops = int(n.flops)
        except Exception:          # a cost model that cannot handle this node: no FLOPs, not no event
            flops = 0
        try:
            nbytes = int(n.bytes_moved)
        except Exception:
            nbytes = 0
        fwd = forward_of(n)
        sites.append((base + seq, n.op, prefix + n.name, n.module_path or "", n.source or "", st.backend.name,
                      st.backend.device, 0, ish, idt, osh, odt, nbytes, flops, bool(st.fallback),
                      int(st.alloc_bytes), int(st.free_bytes), phases[seq], fwd_prefix + fwd if fwd else ""))
    return sites


def child_site(site: int, c, st, prefix: str = "") -> tuple:
    """The site of a stack's span inside region step `st`: the ops it covers (`linear+gelu` when the
    stack fused them), their nodes, shapes from the first one's inputs to the last one's outputs; the
    source column holds the stack's own kernel and node name (`MatMul /n12/MatMul`)."""
    from opscope.runtime.train.joint import phase_of
    members = {m.name: m for m in st.node.attrs.get("members", ())}
    covered = [members[n] for n in c.nodes if n in members]
    op = "+".join(dict.fromkeys(c.ops)) or c.kernel.lower() or "unmapped"
    ish, idt = shapes_json(covered[0].input_meta if covered else [])
    osh, odt = shapes_json(covered[-1].output_meta if covered else [])
    nbytes = 0
    for m in covered:
        try:
            nbytes += int(m.bytes_moved)
        except Exception:          # as plan_sites: a cost model that cannot say, no bytes
            pass
    return (site, op, ",".join(prefix + n for n in c.nodes) or prefix + c.name, c.module_path,
            f"{c.kernel} {c.name}".strip(), st.backend.name, st.backend.device, 1, ish, idt, osh, odt, nbytes,
            int(c.flops), False, 0, 0, phase_of(st.node), "", prefix + c.region, c.clock)


class Recorder:
    # NOTE: it reads an op's outputs only, so a training step may update parameters in place under it
    # (runtime/train/step.py); hooks that look at inputs after an op keep the functional update
    reads_inputs_after_op = False

    def __init__(self, sink, *, values: bool = False, regions: bool = False, flush_events: int = FLUSH_EVENTS,
                 flush_interval_ns: int = FLUSH_INTERVAL_NS):
        self.sink = sink
        self.values = values
        self.regions = regions         # torch.compile regions: end_step() ends steps, not each run
        self.flush_events = flush_events
        self.flush_interval_ns = flush_interval_ns
        self.step = 0                  # active steps recorded so far (warm-up steps are not hooked)
        self.events = 0
        self._plan = None
        self._bases: dict = {}         # id(plan) -> (plan, first site id); the plan is kept so its id stays its own
        self._next_site = 0
        self._base = 0                 # site id of seq 0 of the plan running now
        self._seq0 = 0                 # event seq of its seq 0 (regions count on across a step)
        self._backends: list = []
        self._new_sites: list = []
        self._buf: list = []
        self._pending: list = []       # (index in _buf, PendingTiming)
        self._tensors: list = []
        self._memory: list = []
        self._anchor = None
        self._last_flush = 0
        self._thread = threading.get_native_id()
        self._stack = RegionProfile()  # regions' per-op spans from their stack's profiler
        self._child_sites: dict = {}   # (plan, region, stack node, covered nodes) -> site id

    # --- executor hooks ------------------------------------------------------------------
    def on_run_start(self, info) -> None:
        plan = info.plan
        if plan is not self._plan:
            self._plan = plan
            known = self._bases.get(id(plan))
            if known is None:
                known = self._bases[id(plan)] = (plan, self._next_site)
                self._next_site += len(plan.steps)
                self._new_sites += plan_sites(plan, known[1], self.regions)
            self._base = known[1]
        self._backends = plan.backends
        self._thread = threading.get_native_id()
        self._last_flush = time.perf_counter_ns()
        self._anchor = None
        if any(b.device.startswith("cuda") for b in info.plan.backends):
            import torch
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor_ns = time.perf_counter_ns()
        self._stack.on_run_start(info)

    def after_op(self, call) -> None:
        buf = self._buf
        seq = call.seq
        buf.append((self._base + seq, self._seq0 + seq, call.start_ns, call.end_ns, call.live_bytes))
        if self.values:
            self._summaries(call)
        if call.timing is not None:
            self._pending.append((len(buf) - 1, call.timing))
            return                     # CUDA: flush at the end of the step, when times resolve
        if len(buf) >= self.flush_events or call.end_ns - self._last_flush > self.flush_interval_ns:
            self.flush()

    def on_run_end(self, info, error) -> None:
        if self._pending:
            self._resolve()
        children = self._children(info, error)
        if self.regions:               # one region of the step: the step goes on
            self._seq0 += len(info.plan.steps) + children
            return
        self.end_step()

    def end_step(self) -> None:
        now = time.perf_counter_ns()
        for b in self._backends:       # the backend's own accounting, once per step (seq -1)
            st = b.memory.stats()
            self._memory.append((self.step, -1, now, b.name, int(st.live_bytes), 0, 0))
        self.flush()
        self.step += 1
        self._seq0 = 0

    def _children(self, info, error) -> int:
        """The step's region children as events after the plan's own; how many there were."""
        self._stack.on_run_end(info, error)
        spans = self._stack.children
        self._stack.children = {}
        plan = info.plan
        seq = self._seq0 + len(plan.steps)
        prefix = region_prefix(plan.graph.model_name) if self.regions else ""
        by_name = {st.node.name: st for st in plan.steps if st.node.op == "region"}
        n = 0
        for (_, region), children in spans.items():
            st = by_name.get(region)
            if st is None:
                continue
            for c in children:
                key = (id(plan), region, c.name, tuple(c.nodes))
                site = self._child_sites.get(key)
                if site is None:
                    site = self._child_sites[key] = self._next_site
                    self._next_site += 1
                    self._new_sites.append(child_site(site, c, st, prefix))
                self._buf.append((site, seq + n, c.start_ns, c.end_ns, 0))
                n += 1
        return n

    # --- batches -------------------------------------------------------------------------
    def _resolve(self) -> None:
        # the executor synchronized the device before on_run_end, so every event has completed
        buf = self._buf
        for i, timing in self._pending:
            s, e = timing.resolve(self._anchor, self._anchor_ns)
            site, seq, _, _, live = buf[i]
            buf[i] = (site, seq, s, e, live)
        self._pending = []

    def flush(self) -> None:
        if self._pending:              # mid-step on CUDA: times are not known yet
            return
        buf, self._buf = self._buf, []
        if not buf and not self._tensors and not self._new_sites and not self._memory:
            return
        ev = np.array(buf, dtype=np.int64) if buf else None
        batch = Batch(self.step, self._thread, self._new_sites, ev, self._tensors, self._memory)
        self._tensors, self._memory = [], []
        if self.sink.send(batch):
            self._new_sites = []       # sites go again with the next batch until one gets through
        self.events += len(buf)
        self._last_flush = time.perf_counter_ns()

    def _summaries(self, call) -> None:
        out = call.outputs if call.node.multi_output else [call.outputs]
        to_host = call.backend.memory.to_host
        for i, v in enumerate(out):
            if v is None or isinstance(v, (int, float, bool)):
                continue
            try:
                arr = to_host(v)
            except Exception:
                continue
            row = summarize(arr)
            if row is not None:
                self._tensors.append((self.step, self._seq0 + call.seq, f"out{i}", *row))
