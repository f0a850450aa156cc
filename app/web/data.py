"""Store queries the pages need, with the run's spans cached on the server (never sent whole).

Pages ask `WebData` by run id; a finished run's spans are built once and kept (a few runs, LRU),
a streaming run's are rebuilt when its event count grows.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

import numpy as np

from opscope.profiler.importers.kineto import DEVICE_OPS
from opscope.profiler.store import run_description
from opscope.runtime.errors import UsageError

from . import timeline

_CACHE_RUNS = 4
_STACK_DEPTHS = 8      # Python-stack rows drawn under the op tracks
MEMORY_BUCKETS = 2000  # time buckets of the memory chart: about its width in pixels


class WebData:
    def __init__(self, store=None, live: str | None = None):
        if store is None:
            from opscope.profiler.store import RunStore
            store = RunStore()
        self.store = store
        self.live = live
        self._spans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    # --- runs ----------------------------------------------------------------------------
    def runs(self) -> list[dict]:
        return self.store.list_runs()

    def run(self, run_id: str | None) -> dict | None:
        """The run a page shows: the one asked for, else the live one, else the newest; None if none."""
        rid = run_id or self.live
        try:
            if rid:
                return self.store.get_run(rid)
        except UsageError:
            return None
        runs = self.store.list_runs()
        return runs[0] if runs else None

    def arrived(self, run: dict) -> int:
        """Events stored so far (the runs row counts them as batches land)."""
        if run.get("status") == "running":
            return int(self.store.query("SELECT count(*) FROM events WHERE run_id = ?", [run["run_id"]])[0][0])
        return int(run.get("events") or 0)

    @staticmethod
    def description(run: dict) -> dict:
        return run_description(run)

    @classmethod
    def roofs(cls, run: dict) -> tuple[float, float]:
        """(peak FLOP/s at float32, memory bandwidth bytes/s) from the run's backend description; 0 = unknown."""
        d = cls.description(run)
        peaks = d.get("peak_flops") or {}
        peak = float(peaks.get("float32") or (max(peaks.values()) if peaks else 0.0) or 0.0)
        return peak, float(d.get("memory_bandwidth") or 0.0)

    # --- timeline ------------------------------------------------------------------------
    def spans(self, run: dict, arrived: int | None = None) -> timeline.Spans:
        """arrived: `arrived(run)`, when the caller has counted already (a streaming run's count is a query)."""
        rid = run["run_id"]
        stamp = (self.arrived(run) if arrived is None else arrived, run.get("status"))
        with self._lock:
            hit = self._spans.get(rid)
            if hit and hit[0] == stamp:
                self._spans.move_to_end(rid)
                return hit[1]
        spans = self._load_spans(rid)
        with self._lock:
            self._spans[rid] = (stamp, spans)
            while len(self._spans) > _CACHE_RUNS:
                self._spans.popitem(last=False)
        return spans

    def _load_spans(self, rid: str) -> timeline.Spans:
        # Interning op names and tracks in SQL keeps a million strings out of Python.
        with self.store.connect() as con:
            # Codes come from a join with the (few) distinct names: a hash join, no sort of a million rows.
            name = _span_name_sql()
            cols = con.execute(
                f"""WITH o AS (SELECT o, (row_number() OVER (ORDER BY o)) - 1 AS code
                              FROM (SELECT DISTINCT {name} AS o FROM events WHERE run_id = $r)),
                        k AS (SELECT b, d, t, p, (row_number() OVER (ORDER BY b, d, t, p)) - 1 AS track
                              FROM (SELECT DISTINCT backend AS b, device AS d, thread AS t, coalesce(depth, 0) AS p
                                    FROM events WHERE run_id = $r))
                   SELECT e.start_ns, e.end_ns, e.step, e.seq, o.code AS op_code, k.track
                   FROM events e JOIN o ON o.o = {_span_name_sql("e.")}
                   JOIN k ON k.b IS NOT DISTINCT FROM e.backend AND k.d IS NOT DISTINCT FROM e.device
                         AND k.t IS NOT DISTINCT FROM e.thread AND k.p = coalesce(e.depth, 0)
                   WHERE e.run_id = $r""", {"r": rid}).fetchnumpy()
            named = con.execute(f"""SELECT {name} AS o, any_value(coalesce(op, '?')) FROM events WHERE run_id = ?
                                    GROUP BY o ORDER BY o""", [rid]).fetchall()
            names, groups = [r[0] for r in named], [r[1] for r in named]
            # Nested ops (imports, the eager engine) get a lane per depth under their thread, as trace viewers stack them.
            tracks = con.execute("""SELECT DISTINCT backend, device, thread, coalesce(depth, 0) FROM events
                                    WHERE run_id = ? ORDER BY 1, 2, 3, 4""", [rid]).fetchall()
            stacks = con.execute(
                f"""SELECT t_ns, dur_ns, depth, frame FROM stacks WHERE run_id = ? AND depth < {_STACK_DEPTHS}
                    ORDER BY t_ns""", [rid]).fetchall()
        threads = {(b, d, t) for b, d, t, _ in tracks}
        by_thread = len({(b, d) for b, d, _ in threads}) < len(threads)   # name threads only when they differ
        labels = [_track_label(b, d, t, by_thread) if not p else f"↳ depth {p}" for b, d, t, p in tracks]
        start = np.asarray(cols["start_ns"], np.int64)
        end = np.asarray(cols["end_ns"], np.int64)
        track = np.asarray(cols["track"], np.int64)
        label = np.asarray(cols["op_code"], np.int64)
        key0 = np.asarray(cols["step"], np.int64)
        key1 = np.asarray(cols["seq"], np.int64)
        n_ops = len(names)
        if stacks:
            depths = sorted({r[2] for r in stacks})
            row_of = {d: len(labels) + i for i, d in enumerate(depths)}
            labels += [f"python stack {d}" for d in depths]
            frames = {f: len(names) + i for i, f in enumerate(sorted({r[3] or "?" for r in stacks}))}
            names = names + list(frames)
            groups = groups + ["python frame"] * len(frames)
            start = np.concatenate([start, [r[0] for r in stacks]]).astype(np.int64)
            end = np.concatenate([end, [r[0] + r[1] for r in stacks]]).astype(np.int64)
            track = np.concatenate([track, [row_of[r[2]] for r in stacks]]).astype(np.int64)
            label = np.concatenate([label, [frames[r[3] or "?"] for r in stacks]]).astype(np.int64)
            key0 = np.concatenate([key0, np.full(len(stacks), timeline.STACK_KEY)])
            key1 = np.concatenate([key1, np.arange(len(stacks))])
        return timeline.build(start, end, track, labels, label, names, key0, key1, frames_from=n_ops, groups=groups)

    def step_windows(self, run_id: str) -> list[tuple[int, int, int]]:
        return [tuple(map(int, r)) for r in self.store.query(
            "SELECT step, min(start_ns), max(end_ns) FROM events WHERE run_id = ? GROUP BY step ORDER BY step",
            [run_id])]

    def event(self, run_id: str, step: int, seq: int) -> dict | None:
        cols = ["step", "seq", "op", "node", "module", "source", "backend", "device", "thread", "start_ns", "end_ns",
                "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "bytes", "flops", "fallback",
                "live_bytes"]
        rows = self.store.query(f"SELECT {', '.join(cols)} FROM events WHERE run_id = ? AND step = ? AND seq = ? "
                                "LIMIT 1", [run_id, int(step), int(seq)])
        return dict(zip(cols, rows[0])) if rows else None

    def stack_frame(self, run_id: str, row: int) -> dict | None:
        rows = self.store.query("SELECT t_ns, dur_ns, thread, depth, frame FROM stacks WHERE run_id = ? "
                                f"AND depth < {_STACK_DEPTHS} ORDER BY t_ns", [run_id])
        if 0 <= row < len(rows):
            return dict(zip(["t_ns", "dur_ns", "thread", "depth", "frame"], rows[row]))
        return None

    # --- operators -----------------------------------------------------------------------
    def op_table(self, run: dict, by: str = "op") -> list[dict]:
        peak, _ = self.roofs(run)
        rows = self.store.op_stats(run["run_id"], by=by)
        for r in rows:
            r["pct_peak"] = (100.0 * r["achieved_flops"] / peak) if peak else None
            r["intensity"] = (r["flops"] / r["bytes"]) if r["bytes"] else None
        return rows

    # --- memory --------------------------------------------------------------------------
    def memory_series(self, run_id: str, buckets: int = MEMORY_BUCKETS) -> dict:
        """Live bytes over time per backend: the memory table, else the events' live_bytes column.

        A long run has a sample per op: past `buckets` samples the series becomes, per time bucket, its
        lowest and highest sample (each at its own time), so the chart keeps every spike and the exact
        peak while the browser gets a few thousand points instead of a million."""
        src = """SELECT backend, t_ns AS t, live_bytes AS v FROM memory WHERE run_id = $r"""
        if not self.store.query("SELECT count(*) FROM memory WHERE run_id = ?", [run_id])[0][0]:
            src = """SELECT backend, end_ns AS t, live_bytes AS v FROM events
                     WHERE run_id = $r AND live_bytes IS NOT NULL"""
        with self.store.connect() as con:
            rows = con.execute(
                f"""WITH s AS ({src}), r AS (SELECT min(t) AS lo, max(t) - min(t) + 1 AS span, count(*) AS n FROM s)
                    SELECT backend, t, v FROM s, r WHERE r.n <= $k
                    UNION ALL
                    SELECT backend, unnest([arg_min(t, v), arg_max(t, v)]), unnest([min(v), max(v)])
                    FROM s, r WHERE r.n > $k
                    GROUP BY backend, floor((t - r.lo) * $k / r.span)
                    ORDER BY 1, 2""", {"r": run_id, "k": int(buckets)}).fetchall()
        out: dict = {}
        for backend, t, v in rows:
            series = out.setdefault(backend or "?", ([], []))
            series[0].append(t)
            series[1].append(v)
        return out

    def top_allocators(self, run_id: str, limit: int = 15) -> list[dict]:
        rows = self.store.query(
            """SELECT e.op, count(*), sum(m.alloc_bytes), max(m.live_bytes)
               FROM memory m JOIN events e ON e.run_id = m.run_id AND e.step = m.step AND e.seq = m.seq
               WHERE m.run_id = ? AND m.alloc_bytes > 0 GROUP BY e.op ORDER BY 3 DESC LIMIT ?""", [run_id, limit])
        if not rows:   # no allocation records: output bytes of each op are what it allocates
            rows = self.store.query(
                """SELECT op, count(*), sum(live_bytes - coalesce(prev, 0)) FILTER (WHERE live_bytes > prev),
                          max(live_bytes)
                   FROM (SELECT op, live_bytes, lag(live_bytes) OVER (PARTITION BY step, backend ORDER BY seq) AS prev
                         FROM events WHERE run_id = ? AND live_bytes IS NOT NULL)
                   GROUP BY op HAVING sum(live_bytes - coalesce(prev, 0)) FILTER (WHERE live_bytes > prev) > 0
                   ORDER BY 3 DESC LIMIT ?""", [run_id, limit])
        return [{"op": op, "count": int(n), "alloc_bytes": int(a or 0), "peak_live": int(p or 0)}
                for op, n, a, p in rows]

    # --- tensors -------------------------------------------------------------------------
    def tensor_rows(self, run_id: str) -> list[dict]:
        cols = ["step", "seq", "slot", "op", "node", "shape", "dtype", "count", "min", "max", "mean", "std", "nan",
                "inf", "hist", "hist_lo", "hist_hi"]
        rows = self.store.query(
            """SELECT t.step, t.seq, t.slot, e.op, e.node, t.shape, t.dtype, t.count, t.min, t.max, t.mean, t.std,
                      t.nan, t.inf, t.hist, t.hist_lo, t.hist_hi
               FROM tensors t LEFT JOIN events e ON e.run_id = t.run_id AND e.step = t.step AND e.seq = t.seq
               WHERE t.run_id = ? ORDER BY t.step, t.seq, t.slot""", [run_id])
        return [dict(zip(cols, r)) for r in rows]

    # --- hardware ------------------------------------------------------------------------
    def hardware(self, run_id: str) -> dict:
        return self.store.hardware_frame(run_id)


def _span_name_sql(table: str = "") -> str:
    """A span's name: its op; a GPU kernel's own name (node), grouped under its op ("kernel") for color and legend."""
    device_ops = ", ".join(f"'{x}'" for x in sorted(DEVICE_OPS))
    t = table
    return f"CASE WHEN {t}op IN ({device_ops}) THEN coalesce({t}node, {t}op) ELSE coalesce({t}op, '?') END"


def _track_label(backend, device, thread, by_thread: bool) -> str:
    label = backend or "?"
    stream = bool(device) and device.split(":")[0] == backend      # "cuda" on "cuda:0": a GPU stream (imports)
    if stream:
        label = device
    elif device and device not in label:
        label += f" · {device}"
    if thread is not None and stream:
        label += f" · stream {int(thread)}"
    elif thread is not None and by_thread:
        label += f" · t{int(thread) % 100000}"
    return label
