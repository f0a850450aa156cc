"""The graph engine's recorder: an executor hook that turns every OpCall into an event.

    rec = Recorder(sink, values=False)
    with session.executor.hooked(rec):
        session.run()

The hot path appends one small tuple per op; everything static about an op (names, shapes,
FLOPs, bytes) is computed once per plan as a *site* (see batch.py). On CUDA the executor hands
over PendingTimings; they are resolved once per step against one anchor event.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .batch import Batch, shapes_json
from .summaries import summarize

FLUSH_EVENTS = 4096
FLUSH_INTERVAL_NS = 100_000_000   # a live view sees events at least this often on a slow model


def plan_sites(plan) -> list[tuple]:
    """One site per plan step (site id = seq)."""
    from opscope.runtime.train.joint import forward_of, phase_of
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
        sites.append((seq, n.op, n.name, n.module_path or "", n.source or "", st.backend.name, st.backend.device,
                      0, ish, idt, osh, odt, nbytes, flops, bool(st.fallback), int(st.alloc_bytes),
                      int(st.free_bytes), phases[seq], forward_of(n)))
    return sites


class Recorder:
    def __init__(self, sink, *, values: bool = False, flush_events: int = FLUSH_EVENTS,
                 flush_interval_ns: int = FLUSH_INTERVAL_NS):
        self.sink = sink
        self.values = values
        self.flush_events = flush_events
        self.flush_interval_ns = flush_interval_ns
        self.step = 0                  # active steps recorded so far (warm-up steps are not hooked)
        self.events = 0
        self._plan = None
        self._new_sites: list = []
        self._buf: list = []
        self._pending: list = []       # (index in _buf, PendingTiming)
        self._tensors: list = []
        self._memory: list = []
        self._anchor = None
        self._last_flush = 0
        self._thread = threading.get_native_id()

    # --- executor hooks ------------------------------------------------------------------
    def on_run_start(self, info) -> None:
        if info.plan is not self._plan:
            self._plan = info.plan
            self._new_sites = plan_sites(info.plan)
        self._thread = threading.get_native_id()
        self._last_flush = time.perf_counter_ns()
        self._anchor = None
        if any(b.device.startswith("cuda") for b in info.plan.backends):
            import torch
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor_ns = time.perf_counter_ns()

    def after_op(self, call) -> None:
        buf = self._buf
        buf.append((call.seq, call.start_ns, call.end_ns, call.live_bytes))
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
        now = time.perf_counter_ns()
        for b in info.plan.backends:   # the backend's own accounting, once per step (seq -1)
            st = b.memory.stats()
            self._memory.append((self.step, -1, now, b.name, int(st.live_bytes), 0, 0))
        self.flush()
        self.step += 1

    # --- batches -------------------------------------------------------------------------
    def _resolve(self) -> None:
        # the executor synchronized the device before on_run_end, so every event has completed
        buf = self._buf
        for i, timing in self._pending:
            s, e = timing.resolve(self._anchor, self._anchor_ns)
            seq, _, _, live = buf[i]
            buf[i] = (seq, s, e, live)
        self._pending = []

    def flush(self) -> None:
        if self._pending:              # mid-step on CUDA: times are not known yet
            return
        buf, self._buf = self._buf, []
        if not buf and not self._tensors and not self._new_sites and not self._memory:
            return
        if buf:
            a = np.array(buf, dtype=np.int64)
            ev = np.empty((len(a), 5), np.int64)
            ev[:, 0] = a[:, 0]         # site id = seq for the graph engine
            ev[:, 1:] = a
        else:
            ev = None
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
                self._tensors.append((self.step, call.seq, f"out{i}", *row))
