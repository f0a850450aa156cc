"""Event batches: what the recorder produces, the stream carries and the store writes.

Most of an event never changes from step to step: an op's name, node, module, shapes, dtypes,
bytes and FLOPs belong to its *site* (a node of the plan, or for the eager engine an ATen call
with given shapes in a given module). A batch therefore carries the sites it introduces once,
and per event only integers: (site, seq, start_ns, end_ns, live_bytes). The store joins the two
in SQL, so strings are converted once per site, not once per event.

On the stream a batch travels as a checked msgpack header and raw int64 events (wire.py).
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import numpy as np

from .store import _column, counted

# A site, in this order. alloc/free bytes become memory samples; they are not event columns.
# phase (forward / backward / optimizer) and fwd_node (the forward node a backward op differentiates)
# came later: a site that stops before them (an older sender) takes SITE_DEFAULTS.
SITE_COLUMNS = ["site", "op", "node", "module", "source", "backend", "device", "depth", "input_shapes",
                "input_dtypes", "output_shapes", "output_dtypes", "bytes", "flops", "fallback", "alloc_bytes",
                "free_bytes", "phase", "fwd_node", "parent", "clock"]
SITE_DEFAULTS = ("forward", "", "", "")
# parent and clock (a stack's per-op spans in a region, schema 3) came after phase: each later width is allowed
SITE_WIDTHS = tuple(range(len(SITE_COLUMNS) - len(SITE_DEFAULTS), len(SITE_COLUMNS) + 1, 2))


def full_site(s: tuple) -> tuple:
    """A site of any allowed width, filled to SITE_COLUMNS with the defaults of the columns it stops before."""
    return s + SITE_DEFAULTS[len(SITE_DEFAULTS) - (len(SITE_COLUMNS) - len(s)):] if len(s) < len(SITE_COLUMNS) else s
EVENT_INTS = ["site", "seq", "start_ns", "end_ns", "live_bytes"]


@dataclass
class Batch:
    step: int = 0
    thread: int = 0
    sites: list = field(default_factory=list)           # tuples in SITE_COLUMNS order, new in this batch
    events: np.ndarray | None = None                     # int64 (n, 5) in EVENT_INTS order
    tensors: list = field(default_factory=list)          # rows in store.TENSOR_COLUMNS order
    memory: list = field(default_factory=list)           # extra samples in store.MEMORY_COLUMNS order
    dropped: int = 0                                     # events dropped so far in this run (cumulative)

    @property
    def n(self) -> int:
        return 0 if self.events is None else len(self.events)


def shapes_json(metas) -> tuple[str, str]:
    shapes = [list(m.shape) if m is not None else None for m in metas]
    dtypes = [m.dtype if m is not None else None for m in metas]
    return json.dumps(shapes, separators=(",", ":")), json.dumps(dtypes, separators=(",", ":"))


class BatchWriter:
    """Writes batches of one run into the store; remembers the run's sites."""

    def __init__(self, store, run_id: str):
        self.store = store
        self.run_id = run_id
        self.sites: dict[int, tuple] = {}
        self._frame = None
        self.events = 0
        self.dropped = 0
        self.step_events: dict[int, int] = {}     # stored events per step: which steps a lost message hit
        self._lock = threading.Lock()

    def write(self, batches: list[Batch]) -> int:
        """One connection for many batches: opening the database costs more than a small insert."""
        batches = [b for b in batches if b is not None]
        if not batches:
            return 0
        dropped = max(self.dropped, max(b.dropped for b in batches))
        with self._lock, self.store.connect() as con, counted(con):
            n = self._write_all(con, batches)
            con.execute("UPDATE runs SET events = events + ?, dropped = greatest(dropped, ?) WHERE run_id = ?",
                        [n, dropped, self.run_id])
        self.dropped = dropped
        self.events += n
        for b in batches:
            if b.n:
                self.step_events[b.step] = self.step_events.get(b.step, 0) + b.n
        return n

    def note_dropped(self, dropped: int) -> None:
        """A control message's cumulative count: stored at once, so no count waits for another batch."""
        if dropped > self.dropped:
            self.dropped = dropped
            with self._lock, self.store.connect() as con:
                con.execute("UPDATE runs SET dropped = greatest(dropped, ?) WHERE run_id = ?", [dropped, self.run_id])

    def _write_all(self, con, batches: list[Batch]) -> int:
        """Every batch's events in one INSERT: per-statement costs dominate small batches."""
        tensors, memory, evs, steps, threads = [], [], [], [], []
        for b in batches:
            if b.sites:
                for s in b.sites:
                    self.sites[s[0]] = full_site(s)
                self._frame = None
            tensors += b.tensors
            memory += b.memory
            if b.n:
                evs.append(b.events)
                steps.append(np.full(b.n, b.step, np.int64))
                threads.append(np.full(b.n, b.thread, np.int64))
        if tensors:
            self.store.add_tensors(self.run_id, tensors, con=con)
        if memory:
            self.store.add_memory(self.run_id, memory, con=con)
        if not evs:
            return 0
        if self._frame is None:
            cols = list(zip(*self.sites.values()))
            self._frame = {c: _column(c if c != "site" else "seq", cols[i]) for i, c in enumerate(SITE_COLUMNS)}
        ev = np.concatenate(evs) if len(evs) > 1 else evs[0]
        frame = {c: np.ascontiguousarray(ev[:, i]) for i, c in enumerate(EVENT_INTS)}
        frame["step"] = np.concatenate(steps)
        frame["thread"] = np.concatenate(threads)
        view_e, view_s = f"_ev_{id(self)}", f"_sites_{id(self)}"
        return self._insert(con, view_e, view_s, frame, len(ev))

    def _insert(self, con, view_e, view_s, frame, n) -> int:
        con.register(view_e, frame)
        con.register(view_s, self._frame)
        try:
            con.execute(f"""
                INSERT INTO events (run_id, step, seq, op, node, module, source, backend, device, thread, depth,
                    start_ns, end_ns, input_shapes, input_dtypes, output_shapes, output_dtypes, bytes, flops,
                    fallback, live_bytes, phase, fwd_node, parent, clock)
                SELECT $run, e.step, e.seq, s.op, s.node, s.module, s.source, s.backend, s.device,
                    e.thread, s.depth, e.start_ns, e.end_ns, s.input_shapes, s.input_dtypes, s.output_shapes,
                    s.output_dtypes, s.bytes, s.flops, s.fallback, e.live_bytes, s.phase, s.fwd_node, s.parent, s.clock
                FROM {view_e} e JOIN {view_s} s ON e.site = s.site""", {"run": self.run_id})
            con.execute(f"""
                INSERT INTO memory (run_id, step, seq, t_ns, backend, live_bytes, alloc_bytes, free_bytes)
                SELECT $run, e.step, e.seq, e.end_ns, s.backend, e.live_bytes, s.alloc_bytes,
                    s.free_bytes
                FROM {view_e} e JOIN {view_s} s ON e.site = s.site
                WHERE s.alloc_bytes <> 0 OR s.free_bytes <> 0""", {"run": self.run_id})
        finally:
            con.unregister(view_e)
            con.unregister(view_s)
        return n


def stored_shortfall(store, run_id: str, produced: int, dropped: int) -> str | None:
    """Why the run is incomplete, counted in the store itself (None when every event is there): the
    collector's own tally says what it handed to the store, not what the store kept."""
    stored = int(store.query("SELECT count(*) FROM events WHERE run_id = ?", [run_id])[0][0])
    if stored + dropped == produced:
        return None
    return (f"incomplete: the runner sent {produced} events, the store holds {stored} and {dropped} were counted as "
            f"dropped: {produced - stored - dropped} missing")


class StoreSink:
    """In-process: batches go straight into the store (no stream, nothing dropped)."""

    def __init__(self, store, run_id: str):
        self.writer = BatchWriter(store, run_id)

    def send(self, batch: Batch) -> bool:
        self.writer.write([batch])
        return True

    @property
    def dropped(self) -> int:
        return 0
