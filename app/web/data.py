"""Store queries the pages need, with the run's spans cached on the server (never sent whole).

Pages ask `WebData` by run id; a finished run's spans are built once and kept (a few runs, LRU),
a streaming run's are rebuilt when its event count grows.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

import duckdb
import numpy as np

from opscope.profiler import kept, stats
from opscope.profiler.batch import SITE_COLUMNS
from opscope.profiler.importers.kineto import DEVICE_OPS
from opscope.profiler.store import _column, _selectable, run_description
from opscope.runtime.errors import UsageError

from . import timeline

_CACHE_RUNS = 4
_KEPT_SPANS = "timeline-spans@1"   # NOTE: bump when _load_spans builds something else
# How long the row read for a RUN_STATUS answers the callbacks that fire on it (a page load's), for a row that can
# change with no new status (alerts a monitor writes into a finished run's config): later ones read the store.
LOOKED_UP_S = 10.0
MEMORY_BUCKETS = 2000  # time buckets of the memory chart: about its width in pixels
# hardware samples drawn as counter tracks under the timeline: (column, title, unit). psutil counts CPU per core
# (200 % is two busy cores): the title says so, or a peak over 100 % reads as an impossible share
HW_COUNTERS = [("cpu_percent", "CPU % of a core", "%"), ("mem_bytes", "host memory", "bytes"), ("gpu_util", "GPU %", "%"),
               ("gpu_mem_bytes", "GPU memory", "bytes")]


class WebData:
    """live: the run streaming in: its id, or the profiler's LiveRun, whose collector counts the events it
    has stored in memory; the header's poll reads that count instead of asking the store (which the
    collector is busy writing)."""

    def __init__(self, store=None, live=None):
        if store is None:
            from opscope.profiler.store import RunStore
            store = RunStore()
        self.store = store
        self.live_run = live if hasattr(live, "events_received") else None
        self.live = getattr(live, "run_id", live)
        self._spans: OrderedDict = OrderedDict()
        self._raw: OrderedDict = OrderedDict()        # run -> the rows its spans are built from (_rows)
        self._memo: OrderedDict = OrderedDict()       # (what, run, stamp, ...) -> a computed answer
        self._looked_up: OrderedDict = OrderedDict()  # RUN_STATUS -> (when, the row it was made from): looked_up
        self._pairs: tuple = (None, {})               # the live run's (site, thread) -> its names (_name_pairs)
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

    def run_info(self, run_id: str, status: str | None = None) -> dict | None:
        """The run's row as of `status`: asked of the store again only when the status changes (the header
        shows model, backend and error, which a new event never changes)."""
        def compute():
            run = self.run(run_id)
            return run if run is not None and run["run_id"] == run_id else None
        return self._memoized(("info", run_id, status), compute)

    def looked_up(self, status: dict, run: dict) -> None:
        """The header's lookup (server.py `status`) read `run` to make the RUN_STATUS `status`: the callbacks that
        fire on that status in the same page load (the badge, the alerts, the page's own) take this row instead of
        each opening the store again. Every open holds the store's process lock, so on a first visit they queued
        behind each other and before the page's own reads. A status the live poll makes has no row here: read."""
        with self._lock:
            self._looked_up[_status_key(status)] = (time.monotonic(), run)
            while len(self._looked_up) > 64:
                self._looked_up.popitem(last=False)
        self._memoized(("info", run["run_id"], status.get("status")), lambda: run)

    def status_run(self, status: dict) -> dict | None:
        """The run a RUN_STATUS names: the row its lookup read moments ago, else from the store."""
        with self._lock:
            seen = self._looked_up.get(_status_key(status))
        if seen is not None and time.monotonic() - seen[0] < LOOKED_UP_S:
            return seen[1]
        return self.run(status["run"])

    def arrived(self, run: dict) -> int:
        """Events stored so far: the live run's collector counts them in memory; the runs row for others."""
        if self.live_run is not None and run["run_id"] == self.live and self.live_run.poll() == "running":
            return int(self.live_run.events_received)
        return int(run.get("events") or 0)

    def live_status(self, run_id: str) -> dict | None:
        """{run, status, events, dropped} now. The live run's from the collector's counters (no store query:
        this answers the page's poll every second); another run's from its runs row."""
        lr = self.live_run
        if lr is not None and run_id == self.live:
            status = lr.poll()
            if status == "running":
                return {"run": run_id, "status": status, "events": int(lr.events_received),
                        "dropped": int(lr.dropped)}
        run = self.run(run_id)
        if run is None or run["run_id"] != run_id:
            return None
        return {"run": run_id, "status": run.get("status"), "events": int(run.get("events") or 0),
                "dropped": int(run.get("dropped") or 0)}

    def _memoized(self, key: tuple, compute):
        """A computed answer kept while its key (which holds the run's event count and status) stays the same."""
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
        value = compute()
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > 64:
                self._memo.popitem(last=False)
        return value

    @staticmethod
    def _stamp(run: dict) -> tuple:
        return run["run_id"], int(run.get("events") or 0), run.get("status")

    def times(self, run: dict) -> dict:
        """stats.run_times: the run's busy time (host, device, any) and per step, counted once."""
        return self._memoized(("times", *self._stamp(run)), lambda: kept.run_times(self.store, run))

    def clocks(self, run: dict) -> dict:
        """The clock of each kind of track, {"host": "wall", "device": "simulated" | "wall"}, for the kinds the run has."""
        def compute():
            rows = self.store.query(f"""SELECT DISTINCT {stats.kind_sql()}, starts_with(coalesce(device, ''), 'sim:')
                                        FROM events WHERE run_id = ?""", [run["run_id"]])
            out: dict = {}
            for kind, sim in rows:
                out[kind] = "simulated" if sim or out.get(kind) == "simulated" else "wall"
            return _modelled_host(out, any(sim for _k, sim in rows))
        return self._memoized(("clocks", *self._stamp(run)), lambda: kept.kept(self.store, run, "clocks", compute))

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

    # --- the time axis -----------------------------------------------------------------------
    def raw_step_windows(self, run: dict) -> list[tuple[int, int, int]]:
        """(step, first start, last end) as recorded; a finished run's computed once (a scan of every event: each
        timeline window asked it again for its breaks). A running run's steps: asked each time."""
        def compute():
            return [tuple(map(int, r)) for r in self.store.query(
                "SELECT step, min(start_ns), max(end_ns) FROM events WHERE run_id = ? GROUP BY step ORDER BY 2",
                [run["run_id"]])]
        if run.get("status") == "running":
            return compute()
        return self._memoized(("step windows", *self._stamp(run)), compute)

    def step_shifts(self, run: dict) -> dict[int, int]:
        """ns to take off each step's times on the timeline. A simulated clock restarts each step at the
        host's time, so the host's time between steps (loading, Python) would sit between simulated steps
        as idle device time: those gaps collapse, steps sit back to back, and the timeline marks each break.
        Measured (wall-clock) runs keep their gaps: there, idle time is real."""
        if self.clocks(run).get("device") != "simulated":
            return {}
        def compute():
            shifts, cursor, shift = {}, None, 0
            for step, a, b in self.raw_step_windows(run):
                if cursor is not None and a - shift > cursor:
                    shift = a - cursor           # this step starts where the last one ended
                shifts[step] = shift
                cursor = max(cursor or 0, b - shift)
            return shifts
        return self._memoized(("shifts", *self._stamp(run)), compute)

    def breaks(self, run: dict) -> list[tuple[int, int]]:
        """(where on the timeline, ns of host time collapsed there) for each collapsed gap between steps."""
        shifts = self.step_shifts(run)
        out, prev = [], 0
        for step, a, _b in self.raw_step_windows(run):
            s = shifts.get(step, 0)
            if s > prev:
                out.append((a - s, s - prev))
            prev = s
        return out

    def step_windows(self, run_id: str, run: dict | None = None) -> list[tuple[int, int, int]]:
        """(step, first start, last end) in step order, on the timeline's axis (gaps collapsed)."""
        run = run or self.run(run_id)
        if not run:
            return []
        shifts = self.step_shifts(run)
        return sorted((s, a - shifts.get(s, 0), b - shifts.get(s, 0)) for s, a, b in self.raw_step_windows(run))

    # --- timeline ------------------------------------------------------------------------
    def spans(self, run: dict, arrived: int | None = None) -> timeline.Spans:
        """arrived: `arrived(run)`, when the caller has counted already."""
        rid = run["run_id"]
        tail = self.live_tail(rid) if run.get("status") == "running" else None
        # the live run's spans include those in its collector's memory (_rows): what arrived there counts too
        stamp = (self.arrived(run) if arrived is None else arrived, run.get("status"),
                 tail.total if tail is not None else None)
        with self._lock:
            hit = self._spans.get(rid)
            if hit and hit[0] == stamp:
                self._spans.move_to_end(rid)
                return hit[1]
        spans = self._built_spans(run)
        with self._lock:
            self._spans[rid] = (stamp, spans)
            while len(self._spans) > _CACHE_RUNS:
                self._spans.popitem(last=False)
        return spans

    def _built_spans(self, run: dict) -> timeline.Spans:
        """A finished big run's spans are kept in the store as it is stored (kept.when_stored) or on their first
        build, and read back after: building a million took seconds on every first visit (issue 38)."""
        if kept.key(run) is None or int(run.get("events") or 0) < kept.BIG:
            return self._load_spans(run)
        return kept.kept_bytes(self.store, run, _KEPT_SPANS, lambda: timeline.to_bytes(self._load_spans(run)),
                               read=timeline.from_bytes)

    def _load_spans(self, run: dict) -> timeline.Spans:
        rid = run["run_id"]
        raw = self._rows(run)
        cols, names, groups, tracks = raw["cols"], list(raw["names"]), list(raw["groups"]), raw["tracks"]
        stacks, notes, stack_lanes = raw["stacks"], raw["notes"], raw["stack_lanes"]
        threads = {(r, b, d, t) for r, _c, b, d, t, _ in tracks}
        by_thread = len({(r, b, d) for r, b, d, _ in threads}) < len(threads)   # as _op_track_labels names them
        # the step track comes first, then a training run's phase band: the op tracks are numbered after them
        phase = np.asarray(cols["phase"], np.int64)
        bands = ["steps"] + (["phases"] if (phase > 0).any() else [])
        # an import's annotations and runtime calls: lanes of their own above the ops they wrap, as trace viewers
        lanes = sorted({(b, d, t, fam, dp) for _i, fam, _n, b, d, t, dp, _a, _z in notes},
                       key=lambda k: tuple("" if x is None else x for x in k))
        labels = bands + [f"{_track_label(b, d, t, by_thread)} · {fam}" if k == 0 or lanes[k - 1][:4] != lane[:4]
                          else f"↳ {fam} depth {lane[4]}" for k, lane in enumerate(lanes) for b, d, t, fam, _dp in [lane]]
        labels += _op_track_labels(tracks, stack_lanes)
        sim_run = any(str(d or "").startswith("sim:") for *_k, d, _t, _p in tracks)
        clocks = [None] * len(bands) + [_clock(d, sim_run) for _b, d, _t, _f, _dp in lanes]
        clocks += [_clock(d, sim_run) for *_k, d, _t, _p in tracks]
        start = np.asarray(cols["start_ns"], np.int64)
        end = np.asarray(cols["end_ns"], np.int64)
        track = np.asarray(cols["track"], np.int64) + len(bands) + len(lanes)
        label = np.asarray(cols["op_code"], np.int64)
        key0 = np.asarray(cols["step"], np.int64)
        key1 = np.asarray(cols["seq"], np.int64)
        shifts = self.step_shifts(run)
        if shifts and len(key0):
            steps = np.array(sorted(shifts), np.int64)
            by = np.array([shifts[s] for s in steps], np.int64)
            off = by[np.clip(np.searchsorted(steps, key0), 0, len(steps) - 1)]
            start, end = start - off, end - off
        n_ops = len(names)
        if notes:
            row_of = {k: len(bands) + i for i, k in enumerate(lanes)}
            code = {n: len(names) + i for i, n in enumerate(sorted({r[2] for r in notes}))}
            names = names + list(code)
            groups = groups + ["annotation"] * len(code)
            start = np.concatenate([start, [r[7] for r in notes]]).astype(np.int64)
            end = np.concatenate([end, [r[8] for r in notes]]).astype(np.int64)
            track = np.concatenate([track, [row_of[(r[3], r[4], r[5], r[1], r[6])] for r in notes]]).astype(np.int64)
            label = np.concatenate([label, [code[r[2]] for r in notes]]).astype(np.int64)
            key0 = np.concatenate([key0, np.full(len(notes), timeline.ANNOTATION_KEY)])
            key1 = np.concatenate([key1, [r[0] for r in notes]]).astype(np.int64)
            n_ops = len(names)
        if stacks:
            depths = sorted({r[2] for r in stacks})
            row_of = {d: len(labels) + i for i, d in enumerate(depths)}
            labels += [f"python stack {d}" for d in depths]
            clocks += ["wall"] * len(depths)
            frames = {f: len(names) + i for i, f in enumerate(sorted({r[3] or "?" for r in stacks}))}
            names = names + list(frames)
            groups = groups + ["python frame"] * len(frames)
            start = np.concatenate([start, [r[0] for r in stacks]]).astype(np.int64)
            end = np.concatenate([end, [r[0] + r[1] for r in stacks]]).astype(np.int64)
            track = np.concatenate([track, [row_of[r[2]] for r in stacks]]).astype(np.int64)
            label = np.concatenate([label, [frames[r[3] or "?"] for r in stacks]]).astype(np.int64)
            key0 = np.concatenate([key0, np.full(len(stacks), timeline.STACK_KEY)])
            key1 = np.concatenate([key1, np.arange(len(stacks))])
        # one span per step on the step track, from its first op to its last
        if len(start):
            ev = slice(0, len(cols["step"]))
            steps, inv = np.unique(key0[ev], return_inverse=True)
            s0 = np.full(len(steps), np.iinfo(np.int64).max)
            s1 = np.full(len(steps), np.iinfo(np.int64).min)
            np.minimum.at(s0, inv, start[ev])
            np.maximum.at(s1, inv, end[ev])
            first = len(names)
            names = names + [f"step {int(s)}" for s in steps]
            groups = groups + ["step"] * len(steps)
            start = np.concatenate([start, s0])
            end = np.concatenate([end, s1])
            track = np.concatenate([track, np.zeros(len(steps), np.int64)])
            label = np.concatenate([label, first + np.arange(len(steps))])
            key0 = np.concatenate([key0, np.full(len(steps), timeline.STEP_KEY)])
            key1 = np.concatenate([key1, steps])
        if len(bands) > 1:      # one span per stretch of a phase in a step (key1: step * 8 + phase)
            ev = slice(0, len(cols["step"]))
            segs = timeline.phase_segments(start[ev], end[ev], key0[ev], phase)
            first = len(names)
            names = names + list(timeline.PHASES)
            groups = groups + ["phase"] * len(timeline.PHASES)
            start = np.concatenate([start, [a for _, a, _, _ in segs]]).astype(np.int64)
            end = np.concatenate([end, [b for _, _, b, _ in segs]]).astype(np.int64)
            track = np.concatenate([track, np.ones(len(segs), np.int64)])
            label = np.concatenate([label, [first + p for _, _, _, p in segs]]).astype(np.int64)
            key0 = np.concatenate([key0, np.full(len(segs), timeline.PHASE_KEY)])
            key1 = np.concatenate([key1, [s * 8 + p for s, _, _, p in segs]]).astype(np.int64)
        spans = timeline.build(start, end, track, labels, label, names, key0, key1, frames_from=n_ops, groups=groups)
        spans.clocks = clocks
        # only an import has flows (details.py): a profiled run's million events skip the query
        spans.flows = self._flow_ends(spans, rid) if run.get("engine") == "import" else np.zeros((0, 4), np.int64)
        spans.bands = len(bands)
        spans.step_spans = int(np.isin(key0, (timeline.STEP_KEY, timeline.PHASE_KEY)).sum())
        spans.events = len(cols["step"])
        return spans

    # --- the rows spans are built from, appended while a run streams in ---------------------------------
    def _rows(self, run: dict) -> dict:
        """The run's span rows: its events' columns (start, end, step, seq, op code, track, phase, rowid), names,
        tracks, stacks and annotations. A running run's rows are kept and only the events stored since are read
        (rowid past the last one read): rebuilding every row on each change left the live timeline 2.8-4.6x
        behind the header (bench_live.py). A new op name or track, a new stack sample or annotation, or a count
        that does not add up reads everything again."""
        rid = run["run_id"]
        with self._lock:
            kept = self._raw.get(rid)
        # the live run's newest rows come from its collector's memory: a window shows what arrived, not only what
        # the store has taken so far (seconds behind on a loaded machine, bench_live.py)
        tail = self.live_tail(rid) if run.get("status") == "running" else None
        if kept is not None and run.get("status") == "running":
            rows = _tail_rows(kept, tail, self._named(rid)) if tail is not None else self._new_rows(run, kept)
            if rows is not None:
                if tail is not None:
                    with self._lock:
                        self._raw[rid] = rows
                return rows
        rows = self._full_rows(run)
        if tail is not None:
            rows = _tail_rows(rows, tail, self._named(rid)) or rows
        with self._lock:
            self._raw[rid] = rows
            self._raw.move_to_end(rid)
            while len(self._raw) > _CACHE_RUNS:
                self._raw.popitem(last=False)
        return rows

    def _full_rows(self, run: dict) -> dict:
        rid = run["run_id"]
        lane = stats.lane_depth_sql()
        lane_e = stats.lane_depth_sql("e.")
        track_key = ", ".join(f"{x} AS {a}" for x, a in zip(_track_key_sql(), "rcbdtp"))
        # Interning op names and tracks in SQL keeps a million strings out of Python.
        with self.store.connect(read_only=True) as con:
            # Codes come from a join with the (few) distinct names: a hash join, no sort of a million rows.
            imported = run.get("engine") == "import"
            name = _span_name_sql(imported=imported)
            cols = con.execute(
                f"""WITH o AS (SELECT o, (row_number() OVER (ORDER BY o)) - 1 AS code
                              FROM (SELECT DISTINCT {name} AS o FROM events WHERE run_id = $r)),
                        k AS (SELECT r, c, b, d, t, p, (row_number() OVER (ORDER BY r, c, b, d, t, p)) - 1 AS track
                              FROM (SELECT DISTINCT {track_key} FROM events WHERE run_id = $r))
                   SELECT e.start_ns, e.end_ns, e.step, e.seq, o.code AS op_code, k.track, e.rowid AS rowid,
                          {timeline.phase_sql("e.")}::TINYINT AS phase
                   FROM events e JOIN o ON o.o = {_span_name_sql("e.", imported)}
                   JOIN k ON k.r = {_RANK_SQL.format(t="e.")} AND k.c = {_COMM_SQL.format(t="e.")}
                         AND k.b IS NOT DISTINCT FROM e.backend AND k.d IS NOT DISTINCT FROM e.device
                         AND k.t IS NOT DISTINCT FROM e.thread AND k.p = {lane_e}
                   WHERE e.run_id = $r""", {"r": rid}).fetchnumpy()
            named = con.execute(f"""SELECT {name} AS o, any_value(coalesce(op, '?')) FROM events WHERE run_id = ?
                                    GROUP BY o ORDER BY o""", [rid]).fetchall()
            names, groups = [r[0] for r in named], [r[1] for r in named]
            # Nested ops (imports, the eager engine) get a lane per depth under their thread, as trace viewers
            # stack them; a device stream runs one kernel at a time, so its kernels stay on one lane.
            # by rank first; a rank's collectives on a lane of their own, under its compute lanes
            tracks = con.execute(f"""SELECT DISTINCT {track_key} FROM events
                                    WHERE run_id = ? ORDER BY 1, 2, 3, 4, 5, 6""", [rid]).fetchall()
            # every depth: the innermost frames are the ones that issued each op (level of detail decides
            # what a zoom shows, the info line counts them all)
            stacks = con.execute(f"SELECT t_ns, dur_ns, depth, frame FROM stacks WHERE run_id = ? "
                                 f"ORDER BY {_STACK_ORDER}", [rid]).fetchall()
            notes = self._annotations(con, rid)
            # a compiler stack's per-op spans beneath its regions: their lane is named by the stack's profiler
            stack_lanes = dict(((b, d, t, p), c.split(" (")[0]) for b, d, t, p, c in con.execute(
                f"""SELECT * FROM (SELECT DISTINCT backend, device, thread, {lane},
                    {_selectable(con, "events", ["clock"])[0]} FROM events WHERE run_id = ?) WHERE clock <> ''""",
                [rid]).fetchall())
        cols = {k: np.asarray(v) for k, v in cols.items()}
        return {"cols": cols, "names": names, "groups": groups, "tracks": tracks, "stacks": stacks, "notes": notes,
                "stack_lanes": stack_lanes, "stack_count": len(stacks), "name_sql": name, "imported": imported,
                "last_rowid": int(cols["rowid"].max()) if len(cols["rowid"]) else -1}

    def _new_rows(self, run: dict, kept: dict) -> dict | None:
        """kept plus the events stored since it was read; None when only a full read can say (see _rows)."""
        rid = run["run_id"]
        track_key = ", ".join(_track_key_sql())
        with self.store.connect(read_only=True) as con:
            new = con.execute(f"""SELECT start_ns, end_ns, step, seq, {kept["name_sql"]}, {track_key},
                                         {timeline.phase_sql()}::TINYINT, rowid
                                  FROM events WHERE run_id = $r AND rowid > $last ORDER BY rowid""",
                              {"r": rid, "last": kept["last_rowid"]}).fetchall()
            total, n_stacks = con.execute("""SELECT (SELECT count(*) FROM events WHERE run_id = $r),
                                                    (SELECT count(*) FROM stacks WHERE run_id = $r)""",
                                          {"r": rid}).fetchone()
            if kept["notes"] or n_stacks != kept["stack_count"] or self._annotations(con, rid):
                return None
        code = {n: i for i, n in enumerate(kept["names"])}
        track = {k: i for i, k in enumerate(kept["tracks"])}
        if total != len(kept["cols"]["rowid"]) + len(new) or any(
                r[4] not in code or tuple(r[5:11]) not in track for r in new):
            return None
        if not new:
            return kept
        add = {"start_ns": [r[0] for r in new], "end_ns": [r[1] for r in new], "step": [r[2] for r in new],
               "seq": [r[3] for r in new], "op_code": [code[r[4]] for r in new],
               "track": [track[tuple(r[5:11])] for r in new], "phase": [r[11] for r in new],
               "rowid": [r[12] for r in new]}
        cols = {k: np.concatenate([v, np.asarray(add[k], v.dtype)]) for k, v in kept["cols"].items()}
        rows = {**kept, "cols": cols, "last_rowid": int(new[-1][12])}
        with self._lock:
            self._raw[rid] = rows
        return rows

    def _named(self, run_id: str):
        """pairs -> their (name, group, track key, phase, stack lane) for the live run's tail: each pair named once
        (_name_pairs), as a run has few sites and threads and every answer asks for them."""
        with self._lock:
            if self._pairs[0] != run_id:
                self._pairs = (run_id, {})
            known = self._pairs[1]

        def named(pairs: list[tuple[int, int]], sites: dict) -> list[tuple]:
            if new := [p for p in pairs if p not in known]:
                known.update(_name_pairs(sites, new))
            return [known[p] for p in pairs]
        return named

    def live_tail(self, run_id: str):
        """The live run's spans in its collector's memory (profiler/tail.py) while it runs, else None."""
        lr = self.live_run
        if lr is None or run_id != self.live or lr.poll() != "running":
            return None
        return getattr(getattr(lr, "collector", None), "tail", None)

    def live_spans(self, run: dict, since: int = 0, origin: int | None = None) -> dict:
        """The run's op spans from the `since`-th one stored (in the order they arrived): what a live page has not
        drawn yet. {total, since, start, end, step, seq, name, track}: track the timeline's track label, times on
        the timeline's axis (a simulated run's steps moved back to back, as `spans` does) and, with `origin` (the
        page's first span, ns), relative to it: absolute clocks (time.time_ns) lose digits in a JavaScript number.
        The live run's come from its collector's memory as they arrive, before they are in the store."""
        tail = self.live_tail(run["run_id"])
        got = tail.since(since) if tail is not None else None
        if got is not None and not _simulated(got):
            return _tail_spans(got, since, origin, self._named(run["run_id"]))
        raw = self._rows(run)
        cols = raw["cols"]
        order = np.argsort(cols["rowid"], kind="stable")[max(int(since), 0):]
        start, end = cols["start_ns"][order].astype(np.int64), cols["end_ns"][order].astype(np.int64)
        step = cols["step"][order].astype(np.int64)
        if len(order) and any(str(k[3] or "").startswith("sim:") for k in raw["tracks"]):
            shifts = self.step_shifts(run)
            start = start - np.asarray([shifts.get(int(s), 0) for s in step], np.int64)
            end = end - np.asarray([shifts.get(int(s), 0) for s in step], np.int64)
        if origin is not None:
            start, end = start - int(origin), end - int(origin)
        labels = _op_track_labels(raw["tracks"], raw["stack_lanes"])
        return {"total": int(len(cols["rowid"])), "since": int(since), "start": start.tolist(), "end": end.tolist(),
                "step": step.tolist(), "seq": cols["seq"][order].astype(np.int64).tolist(),
                "name": [raw["names"][int(c)] for c in cols["op_code"][order]],
                "track": [labels[int(k)] for k in cols["track"][order]]}

    @staticmethod
    def _annotations(con, rid: str) -> list[tuple]:
        """An import's spans that are not ops (user annotations, runtime calls): (row, lane family, name, backend,
        device, thread, depth, start, end), row their index in `annotation`'s order. The profiler's own
        whole-trace span ("Trace") is left out: it covers everything and says nothing."""
        try:
            rows = con.execute(f"""SELECT (row_number() OVER (ORDER BY {_NOTE_ORDER})) - 1, kind, coalesce(name, '?'),
                                          backend, device, thread, coalesce(depth, 0), start_ns, end_ns
                                   FROM spans WHERE run_id = ?""", [rid]).fetchall()
        except Exception:        # a store from before the spans table: nothing to draw
            return []
        return [(i, _lane_family(kind), n, b, d, t, dp, a, z) for i, kind, n, b, d, t, dp, a, z in rows
                if kind != "Trace"]

    def annotation(self, run_id: str, row: int) -> dict | None:
        """The timeline's annotation span `row` (ANNOTATION_KEY's key1): kind, name, where, when, args."""
        cols = ["kind", "name", "backend", "device", "thread", "depth", "step", "start_ns", "end_ns", "args"]
        rows = self.store.query(f"SELECT {', '.join(cols)} FROM spans WHERE run_id = ? ORDER BY {_NOTE_ORDER} "
                                "LIMIT 1 OFFSET ?", [run_id, max(int(row), 0)]) if row >= 0 else []
        return dict(zip(cols, rows[0])) if rows else None

    def _flow_ends(self, spans: timeline.Spans, rid: str) -> np.ndarray:
        """An import's flows (a launch to its kernel, a forward op to its backward) as rows [from_t, from_track,
        to_t, to_track], each end on the track of the span that starts there (an op by its step and seq, else an
        annotation or runtime call of that thread starting at that time)."""
        try:
            f = self.store.flows_frame(rid)
        except Exception:
            return np.zeros((0, 4), np.int64)
        n = len(f.get("from_ns", []))
        if not n:
            return np.zeros((0, 4), np.int64)
        track_of = np.searchsorted(spans.offsets, np.arange(len(spans.start)), "right") - 1
        events = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(spans.key0, spans.key1)) if a >= 0}
        notes = {int(spans.start[i]): int(track_of[i]) for i in np.flatnonzero(spans.key0 == timeline.ANNOTATION_KEY)}
        ops = {int(spans.start[i]): int(track_of[i]) for i in np.flatnonzero(spans.key0 >= 0)}
        out = []
        for k in range(n):
            ends = []
            for side in ("from", "to"):
                t = int(f[f"{side}_ns"][k])
                step, seq = f[f"{side}_step"][k], f[f"{side}_seq"][k]
                i = events.get((int(step), int(seq))) if _given(step) and _given(seq) else None
                op = int(track_of[i]) if i is not None else ops.get(t)
                # a launch arrow (ac2g) leaves from the runtime call (cudaLaunchKernel), not the op that made it
                tr = (notes.get(t) or op) if side == "from" and f["kind"][k] == "ac2g" else (op or notes.get(t))
                ends += [t, tr]
            if None not in ends:
                out.append(ends)
        return np.asarray(out, np.int64).reshape(-1, 4)

    def counters(self, run: dict) -> list[dict]:
        """The tracks drawn under the timeline, on its axis: live bytes per backend (the memory samples) and
        the hardware counters. [{name, unit, clock, t (int64 ns), v (float64)}]."""
        def compute():
            out = []
            shifts = self.step_shifts(run)
            for backend, (t, v, steps) in sorted(self._memory_points(run["run_id"]).items()):
                t = np.asarray(t, np.int64) - np.asarray([shifts.get(s, 0) for s in steps], np.int64)
                out.append({"name": f"live bytes · {backend}", "unit": "bytes", "t": t,
                            "v": np.asarray([x or 0 for x in v], np.float64)})
            hw = self.hardware(run["run_id"])
            if len(hw.get("t_ns", [])):
                t = np.asarray(hw["t_ns"], np.int64)
                if shifts:       # host samples: placed by the step that was running (a simulated axis has no host time)
                    raw = self.raw_step_windows(run)
                    starts = np.array([a for _, a, _ in raw], np.int64)
                    by = np.array([shifts.get(s, 0) for s, _, _ in raw], np.int64)
                    t = t - by[np.clip(np.searchsorted(starts, t, "right") - 1, 0, len(by) - 1)]
                for key, title, unit in HW_COUNTERS:
                    v = _floats(hw.get(key))
                    if len(v) == len(t) and np.isfinite(v).any() and np.nansum(np.abs(v)) > 0:
                        out.append({"name": title, "unit": unit, "t": t, "v": v})
            return out
        return self._memoized(("counters", *self._stamp(run)), compute)

    def _memory_points(self, run_id: str, buckets: int = MEMORY_BUCKETS) -> dict:
        return self.memory_series(run_id, buckets, with_steps=True)

    def event(self, run_id: str, step: int, seq: int) -> dict | None:
        cols = ["step", "seq", "op", "node", "module", "source", "backend", "device", "thread", "start_ns", "end_ns",
                "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "bytes", "flops", "fallback",
                "live_bytes", "parent", "clock"]
        with self.store.connect(read_only=True) as con:    # parent, clock: '' in a store older than them
            rows = con.execute(f"SELECT {', '.join(_selectable(con, 'events', cols))} FROM events WHERE run_id = ? "
                               "AND step = ? AND seq = ? LIMIT 1", [run_id, int(step), int(seq)]).fetchall()
        return dict(zip(cols, rows[0])) if rows else None

    def stack_frame(self, run_id: str, row: int) -> dict | None:
        rows = self.store.query("SELECT t_ns, dur_ns, thread, depth, frame FROM stacks WHERE run_id = ? "
                                f"ORDER BY {_STACK_ORDER}", [run_id])
        if 0 <= row < len(rows):
            return dict(zip(["t_ns", "dur_ns", "thread", "depth", "frame"], rows[row]))
        return None

    # --- operators -----------------------------------------------------------------------
    def op_table(self, run: dict, by: str = "op") -> list[dict]:
        """stats.op_breakdown (host and device apart, total and self shares) with % of peak and intensity."""
        def compute():
            with self.store.connect(read_only=True) as con:
                return stats.op_breakdown(con, run["run_id"], by=by, times=self.times(run))
        peak, bw = self.roofs(run)
        rows = [dict(r) for r in self._memoized(("ops", by, *self._stamp(run)), compute)]
        stats.per_step(rows, stats.step_count(self.times(run)))     # the Compare page's and the CLI's division
        for r in rows:
            r["pct_peak"] = (100.0 * r["achieved_flops"] / peak) if peak and r["flops"] else None
            r["intensity"] = (r["flops"] / r["bytes"]) if r["bytes"] else None
            bandwidth(r, bw)
        return rows

    # --- memory --------------------------------------------------------------------------
    def _memory_source(self, run_id: str) -> str:
        if self.store.query("SELECT count(*) FROM memory WHERE run_id = ?", [run_id])[0][0]:
            return "SELECT backend, t_ns AS t, live_bytes AS v, step, seq FROM memory WHERE run_id = $r"
        return """SELECT backend, end_ns AS t, live_bytes AS v, step, seq FROM events
                  WHERE run_id = $r AND live_bytes IS NOT NULL"""

    def memory_series(self, run_id: str, buckets: int = MEMORY_BUCKETS, with_steps: bool = False) -> dict:
        """Live bytes over time per backend: the memory table, else the events' live_bytes column.

        A long run has a sample per op: past `buckets` samples the series becomes, per time bucket, its
        lowest and highest sample (each at its own time), so the chart keeps every spike and the exact
        peak while the browser gets a few thousand points instead of a million.
        with_steps: each series also carries the step of each sample (to place it on the timeline's axis)."""
        with self.store.connect(read_only=True) as con:
            rows = con.execute(
                f"""WITH s AS ({self._memory_source(run_id)}),
                         r AS (SELECT min(t) AS lo, max(t) - min(t) + 1 AS span, count(*) AS n FROM s)
                    SELECT backend, t, v, step FROM s, r WHERE r.n <= $k
                    UNION ALL
                    SELECT backend, unnest([arg_min(t, v), arg_max(t, v)]), unnest([min(v), max(v)]),
                           unnest([arg_min(step, v), arg_max(step, v)])
                    FROM s, r WHERE r.n > $k
                    GROUP BY backend, floor((t - r.lo) * $k / r.span)
                    ORDER BY 1, 2""", {"r": run_id, "k": int(buckets)}).fetchall()
        out: dict = {}
        for backend, t, v, step in rows:
            series = out.setdefault(backend or "?", ([], [], []) if with_steps else ([], []))
            series[0].append(t)
            series[1].append(v)
            if with_steps:
                series[2].append(step)
        return out

    def memory_peaks(self, run: dict) -> list[dict]:
        """Per backend, the highest live-bytes sample and the op that held it: {backend, bytes, t (on the
        timeline's axis), step, seq, op, node}."""
        rid = run["run_id"]
        with self.store.connect(read_only=True) as con:
            rows = con.execute(
                f"""WITH s AS ({self._memory_source(rid)}),
                         p AS (SELECT backend, max(v) AS v, arg_max(t, v) AS t, arg_max(step, v) AS step,
                                      arg_max(seq, v) AS seq FROM s GROUP BY backend)
                    SELECT p.backend, p.v, p.t, p.step, p.seq, e.op, e.node FROM p
                    LEFT JOIN events e ON e.run_id = $r AND e.step = p.step AND e.seq = p.seq
                    ORDER BY p.backend""", {"r": rid}).fetchall()
        shifts = self.step_shifts(run)
        return [{"backend": b or "?", "bytes": int(v or 0), "t": int(t) - shifts.get(step, 0), "step": step,
                 "seq": seq, "op": op, "node": node} for b, v, t, step, seq, op, node in rows]

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


def page_data() -> WebData | None:
    """The WebData of the app serving this request, for a page's layout (several apps may share a process);
    None when there is no request (Dash validating the layout)."""
    try:
        from flask import current_app
        return getattr(current_app, "opscope_data", None)
    except RuntimeError:
        return None


def bandwidth(row: dict, peak_bw: float) -> dict:
    """achieved_bps (bytes moved per second of the op's time) and pct_bw (of the description's memory bandwidth):
    what a memory-bound op and a transfer are measured by (a copy has no FLOPs)."""
    t = row.get("total_ns") or 0
    row["achieved_bps"] = row["bytes"] / (t / 1e9) if row.get("bytes") and t else None
    row["pct_bw"] = 100.0 * row["achieved_bps"] / peak_bw if row["achieved_bps"] and peak_bw else None
    return row


def _span_name_sql(table: str = "", imported: bool = False) -> str:
    """A span's name: its op; a GPU kernel's own name (node), grouped under its op ("kernel") for color and legend.
    An imported trace's spans keep the trace's names (`aten::mm`: its node), as every table shows them, so the
    find box finds what the user recorded; the op colors them."""
    device_ops = ", ".join(f"'{x}'" for x in sorted(DEVICE_OPS))
    t = table
    if imported:
        return f"coalesce(nullif({t}node, ''), {t}op, '?')"
    return f"CASE WHEN {t}op IN ({device_ops}) THEN coalesce({t}node, {t}op) ELSE coalesce({t}op, '?') END"


def _track_key_sql(t: str = "") -> list[str]:
    """An op's timeline track (rank, comm, backend, device, thread, lane depth): one set of expressions for a read
    of the store and for a live run's spans named from its collector's memory (_name_pairs)."""
    return [_RANK_SQL.format(t=t), _COMM_SQL.format(t=t), f"{t}backend", f"{t}device", f"{t}thread",
            stats.lane_depth_sql(t)]


_SITE_AT = {c: SITE_COLUMNS.index(c) for c in ("op", "node", "backend", "device", "depth", "phase", "clock")}


def _name_pairs(sites: dict, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], tuple]:
    """Each (site, thread) of a live run's tail (profiler/tail.py) as a read of the store has it: (name, group,
    track key, phase index, stack lane), by the SQL _full_rows runs, over the site's columns as the collector's
    writer puts them in the store (store._column): one set of rules, whichever way a span reaches the page."""
    rows = [sites[s] for s, _ in pairs]
    frame = {c: _column(c, [r[i] for r in rows]) for c, i in _SITE_AT.items()}
    frame["thread"] = np.asarray([t for _, t in pairs], np.int64)
    with duckdb.connect() as con:           # in memory: a few rows, only when a pair is new
        con.register("pairs", frame)
        got = con.execute(f"""SELECT {_span_name_sql()}, coalesce(op, '?'), {", ".join(_track_key_sql())},
                                     {timeline.phase_sql()}, clock
                              FROM (SELECT *, NULL::BIGINT AS rank FROM pairs)""").fetchall()
    return {pair: (r[0], r[1], tuple(r[2:8]), r[8], r[9].split(" (")[0] if r[9] else None)
            for pair, r in zip(pairs, got)}


def _tail_pairs(got: dict, named) -> tuple[list[tuple], np.ndarray]:
    """A tail's spans grouped by (site, thread), named and placed once per pair, not per span: (named(pairs) in
    their order: (name, group, track key, phase, stack lane) each, each span's pair)."""
    if not len(got["site"]):
        return [], np.zeros(0, np.int64)
    pairs, inverse = np.unique(np.stack([got["site"], got["thread"]], 1), axis=0, return_inverse=True)
    return named([(int(s), int(t)) for s, t in pairs], got["sites"]), np.asarray(inverse).reshape(-1)


def _simulated(got: dict) -> bool:
    """A simulated clock's steps are moved back to back by shifts read from the store: such a run reads the store."""
    return any(_clock(s[_SITE_AT["device"]]) == "simulated" for s in got["sites"].values())


def _tail_rows(kept: dict, tail, named) -> dict | None:
    """kept (rows read from the store, or from the tail before) plus the spans the live run's collector received
    since (profiler/tail.py), coded as _full_rows codes them; a new name or track is added after the others. None
    when only the store can say: spans no longer held, an import's annotations, a simulated clock."""
    if kept["notes"] or kept["imported"]:
        return None
    cols = kept["cols"]
    got = tail.since(len(cols["rowid"]))
    if got is None or _simulated(got):
        return None
    pairs, inverse = _tail_pairs(got, named)
    if not pairs:
        return kept
    names, groups, tracks = list(kept["names"]), list(kept["groups"]), list(kept["tracks"])
    code, track = {x: i for i, x in enumerate(names)}, {k: i for i, k in enumerate(tracks)}
    stack_lanes = dict(kept["stack_lanes"])
    pair_code, pair_track, pair_phase = [], [], []
    for name, group, key, phase, lane in pairs:
        if name not in code:
            code[name] = len(names)
            names.append(name)
            groups.append(group)
        if key not in track:
            track[key] = len(tracks)
            tracks.append(key)
            if lane:
                stack_lanes[key[2:]] = lane
        pair_code.append(code[name])
        pair_track.append(track[key])
        pair_phase.append(phase)
    last = int(kept["last_rowid"])
    add = {"start_ns": got["start_ns"], "end_ns": got["end_ns"], "step": got["step"], "seq": got["seq"],
           "op_code": np.asarray(pair_code)[inverse], "track": np.asarray(pair_track)[inverse],
           "phase": np.asarray(pair_phase)[inverse],
           "rowid": np.arange(last + 1, last + 1 + len(inverse))}     # arrival order, after the store's rows
    cols = {k: np.concatenate([v, np.asarray(add[k], v.dtype)]) for k, v in cols.items()}
    return {**kept, "cols": cols, "names": names, "groups": groups, "tracks": tracks, "stack_lanes": stack_lanes,
            "last_rowid": last + len(inverse)}


def _tail_spans(got: dict, since: int, origin: int | None, named) -> dict:
    """WebData.live_spans' answer from a live run's tail (profiler/tail.py): each span named and put on its track
    by the rules a read of the store follows, so an appended span lands where a fresh window draws it."""
    lanes = sorted(got["lanes"])
    tracks, stack_lanes = [], {}
    for _name, _group, key, _phase, lane in named(lanes, got["sites"]):
        if key not in tracks:
            tracks.append(key)
        if lane:
            stack_lanes[key[2:]] = lane
    label = dict(zip(tracks, _op_track_labels(tracks, stack_lanes)))
    pairs, inverse = _tail_pairs(got, named)
    names = [name for name, *_ in pairs]
    labels = [label[key] for _name, _group, key, *_ in pairs]
    start, end = got["start_ns"], got["end_ns"]
    if origin is not None:
        start, end = start - int(origin), end - int(origin)
    return {"total": int(got["total"]), "since": int(since), "start": start.tolist(), "end": end.tolist(),
            "step": got["step"].tolist(), "seq": got["seq"].tolist(), "name": [names[i] for i in inverse],
            "track": [labels[i] for i in inverse]}


MODELLED_HOST = "modelled host"   # a sim run's fallback ops: the host's roofline on the sim's time base


def _clock(device, sim_run: bool = False) -> str:
    """The clock a track's times come from: a simulated chip's, the host's (and a GPU's measured) wall clock, or
    on a sim run the modelled host time its fallback ops take (sim_backend.HOST: every gelu alike, not measured)."""
    if str(device or "").startswith("sim:"):
        return "simulated"
    return MODELLED_HOST if sim_run else "wall"


def _modelled_host(clocks: dict, sim_run: bool) -> dict:
    # NOTE: OPSCOPE_HOST_TIME=measured keeps real host durations, but the run does not record it; modelled is
    # the default, so that is what a sim run's host lanes are labelled
    return {k: MODELLED_HOST if sim_run and v == "wall" else v for k, v in clocks.items()}


def _floats(col) -> np.ndarray:
    """A store column as float64 with NaN for missing samples (NULLs come back masked, or as None)."""
    if col is None:
        return np.zeros(0)
    if isinstance(col, np.ma.MaskedArray):
        return np.ma.filled(col.astype(np.float64), np.nan)
    return np.asarray([np.nan if x is None else x for x in col], np.float64)


_STACK_ORDER = "t_ns, depth, thread, dur_ns, frame"   # the stack rows' order (a click's key1 is the row's index)
_NOTE_ORDER = "backend, device, thread, start_ns, depth, name"   # the annotation rows' order (the click's key)


def _lane_family(kind) -> str:
    """An annotation's lane: user annotations (host or GPU) together, runtime calls by their kind."""
    kind = str(kind or "other")
    return "annotations" if kind.endswith("user_annotation") else kind.replace("_", " ")


def _given(x) -> bool:
    return x is not None and not (isinstance(x, float) and np.isnan(x)) and x is not np.ma.masked


_RANK_SQL = "coalesce({t}rank, 0)"
_COMM_SQL = "coalesce({t}phase = 'communication', false)"   # collectives: a lane of their own per rank


def _keep_spans(store, run_id: str) -> None:
    """kept.when_stored's part for the timeline: a big run's spans built and kept as it is stored."""
    WebData(store).spans(store.get_run(run_id))


kept.KEEPERS.append(_keep_spans)


def _op_track_labels(tracks: list[tuple], stack_lanes: dict) -> list[str]:
    """The timeline's label of each op track (rank, comm, backend, device, thread, lane depth): one function for
    the whole-run spans and the live page's appended ones, so an appended span lands on the track drawn."""
    threads = {(r, b, d, t) for r, _c, b, d, t, _ in tracks}
    by_thread = len({(r, b, d) for r, b, d, _ in threads}) < len(threads)   # name threads only when they differ
    ranked = len({r for r, *_ in tracks}) > 1
    return [_track_label(b, d, t, by_thread, rank=r if ranked else None, comm=c) if not p
            else f"↳ {stack_lanes.get((b, d, t, p)) or f'depth {p}'}" for r, c, b, d, t, p in tracks]


def _track_label(backend, device, thread, by_thread: bool, rank: int | None = None, comm: bool = False) -> str:
    """A track's name: `rank N · <backend>` and `rank N · communication` on a multi-rank run (rank given)."""
    if rank is not None:
        return f"rank {int(rank)} · " + ("communication" if comm else _track_label(backend, device, thread, by_thread))
    if comm:
        return _track_label(backend, device, thread, by_thread) + " · communication"
    label = backend or "?"
    # "cuda" on "cuda:0": a GPU stream (imports); a stack's device (onnxruntime:CPUExecutionProvider) is no stream
    stream = ":" in (device or "") and device.split(":")[0] == backend and device.split(":")[1][:1].isdigit()
    if stream:
        label = device
    elif device and device not in label:
        label += f" · {device}"
    if thread is not None and stream:
        label += f" · stream {int(thread)}"
    elif thread is not None and by_thread:
        label += f" · t{int(thread) % 100000}"
    return label


def _status_key(status: dict) -> tuple:
    return tuple(status.get(k) for k in ("run", "status", "events", "dropped"))
