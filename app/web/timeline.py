"""Level of detail for the timeline: a run of a million spans becomes a figure of a few thousand.

At a zoom window [t0, t1] drawn `px` pixels wide, a span shorter than one pixel cannot be seen on
its own. Those spans are summed into per-pixel buckets (how many, how busy) and drawn as one gray
segment per bucket; spans at least a pixel wide are drawn as themselves, the widest first, up to
`max_spans` per track. `payload` packs one window for the browser, which draws it with WebGL
(assets/timeline.js) and asks again for each new zoom window.
"""
from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass

import numpy as np

from . import theme

PX = 1400              # buckets across the window: about the plot's width in pixels
MAX_SPANS = 2000       # individually drawn spans per track at any zoom
STACK_KEY = -2         # key0 of a Python-stack span (events use key0 = step >= 0)
STEP_KEY = -3          # key0 of a span on the step track (key1: the step)
ANNOTATION_KEY = -5    # key0 of an imported annotation or runtime call (key1: its row, WebData.annotation)
PHASE_KEY = -4         # key0 of a span on the phase band of a training run (key1: step * 8 + phase code)
PHASES = ("forward", "backward", "optimizer")
# the phase band's colors: the forward pass cool, the backward warm, the optimizer neutral (as HTA/TensorBoard)
PHASE_COLORS = {"forward": "#60a5fa", "backward": "#f59e0b", "optimizer": "#a78bfa"}


@dataclass
class Spans:
    """A run's spans grouped by track, sorted by start inside each track."""
    tracks: list[str]          # track labels, top to bottom
    offsets: np.ndarray        # spans of track k are [offsets[k], offsets[k+1])
    start: np.ndarray          # int64 ns
    end: np.ndarray
    label: np.ndarray          # int32 index into names
    names: list[str]           # op names, then Python frames
    frames_from: int           # names[frames_from:] are Python frames
    groups: list[str]          # per name, what colors it and names it in the legend: the op (a kernel's is "kernel")
    key0: np.ndarray           # step (or STACK_KEY for a Python frame)
    key1: np.ndarray           # seq (or the frame's row)
    maxdur: np.ndarray         # per track: the longest span, to find spans that began before t0
    t_min: int
    t_max: int
    clocks: list | None = None  # per track: "simulated", "wall", or None (the step track)
    step_spans: int = 0         # spans on the band tracks (steps, phases): not counted as spans
    events: int = 0             # the run's events these spans were built from (a live page asks for those after)
    bands: int = 0              # the first `bands` tracks are bands (steps, phases), not ops
    colors: list | None = None  # per name, its color (span_colors)
    flows: np.ndarray | None = None  # an import's arrows: rows [from_t, from_track, to_t, to_track] (ns, absolute)

    @property
    def count(self) -> int:
        return len(self.start) - self.step_spans


def build(start, end, track, tracks, label, names, key0, key1, frames_from: int | None = None,
          groups: list[str] | None = None) -> Spans:
    start = np.asarray(start, dtype=np.int64)
    end = np.maximum(np.asarray(end, dtype=np.int64), start)
    track = np.asarray(track, dtype=np.int64)
    order = np.lexsort((start, track))
    start, end, track = start[order], end[order], track[order]
    offsets = np.searchsorted(track, np.arange(len(tracks) + 1)).astype(np.int64)
    dur = end - start
    maxdur = np.array([dur[offsets[k]:offsets[k + 1]].max(initial=0) for k in range(len(tracks))], dtype=np.int64)
    return Spans(tracks=list(tracks), offsets=offsets, start=start, end=end,
                 label=np.asarray(label, dtype=np.int32)[order], names=list(names),
                 frames_from=len(names) if frames_from is None else frames_from,
                 groups=list(names) if groups is None else list(groups),
                 key0=np.asarray(key0, dtype=np.int64)[order], key1=np.asarray(key1, dtype=np.int64)[order],
                 maxdur=maxdur, t_min=int(start.min()) if len(start) else 0,
                 t_max=int(end.max()) if len(end) else 1)


_ARRAYS = ("offsets", "start", "end", "label", "key0", "key1", "maxdur")
_FIELDS = ("tracks", "names", "frames_from", "groups", "t_min", "t_max", "clocks", "step_spans", "bands", "events")


def to_bytes(spans: Spans) -> bytes:
    """A run's spans as bytes (numpy's .npz, no pickle), for the store to keep: a finished 1M-event run's are built
    once (seconds of SQL and sorting) and read back in a fraction of that (profiler/kept.py)."""
    buf = io.BytesIO()
    meta = json.dumps({f: getattr(spans, f) for f in _FIELDS}).encode()
    flows = spans.flows if spans.flows is not None else np.zeros((0, 4), np.int64)
    np.savez(buf, meta=np.frombuffer(meta, np.uint8), flows=flows, **{a: getattr(spans, a) for a in _ARRAYS})
    return buf.getvalue()


def from_bytes(data: bytes) -> Spans:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes())
        return Spans(**meta, **{a: z[a] for a in _ARRAYS}, flows=z["flows"])


@dataclass
class Lod:
    """What one zoom window draws: some spans as themselves, the rest as per-pixel buckets."""
    t0: int
    t1: int
    shown: np.ndarray          # indices into Spans arrays
    b_track: np.ndarray        # buckets: track, start, end (ns), how many spans, busy ns
    b_start: np.ndarray
    b_end: np.ndarray
    b_count: np.ndarray
    b_busy: np.ndarray
    b_hits: np.ndarray         # per bucket: how many of its spans match the search (0 without one)
    visible: int               # spans overlapping the window
    hits: int = 0              # spans in the window that match the search


def phase_sql(t: str = "") -> str:
    """An event's phase as its index in PHASES (-1 for a transfer or no phase): a small int, not a string per event."""
    return "CASE " + " ".join(f"WHEN {t}phase = '{p}' THEN {i}" for i, p in enumerate(PHASES)) + " ELSE -1 END"


def phase_segments(start, end, step, phase) -> list[tuple[int, int, int, int]]:
    """A training run's phase band: (step, start, end, phase index) for each stretch of one phase in a step.

    A stretch runs from its first op's start to its last op's end, in time order; a transfer (phase -1)
    between two ops of one phase does not break it."""
    start, end, step, phase = (np.asarray(a, np.int64) for a in (start, end, step, phase))
    keep = phase >= 0
    start, end, step, phase = start[keep], end[keep], step[keep], phase[keep]
    if not len(start):
        return []
    order = np.lexsort((start, step))
    start, end, step, phase = start[order], end[order], step[order], phase[order]
    cut = np.flatnonzero((step[1:] != step[:-1]) | (phase[1:] != phase[:-1])) + 1
    firsts, lasts = np.r_[0, cut], np.r_[cut, len(start)]
    return [(int(step[a]), int(start[a]), int(end[a:b].max()), int(phase[a])) for a, b in zip(firsts, lasts)]


def level_of_detail(spans: Spans, t0: int, t1: int, px: int = PX, max_spans: int = MAX_SPANS,
                    match: np.ndarray | None = None) -> Lod:
    """match: per name (label code), whether it matches the user's search; its spans too small to draw
    are counted per bucket, so a search finds a 50 ns kernel in a whole-run view."""
    t0, t1 = int(t0), int(max(t1, t0 + 1))
    width = (t1 - t0) / px
    shown, bt, bs, be, bc, bb, bh = [], [], [], [], [], [], []
    visible = hits = 0
    for k in range(len(spans.tracks)):
        idx = _overlapping(spans, k, t0, t1)
        if k >= spans.bands:
            visible += len(idx)
        if match is not None:
            hits += int(match[spans.label[idx]].sum())
        dur = spans.end[idx] - spans.start[idx]
        big = dur >= width
        if big.sum() > max_spans:        # keep the widest; the rest join the buckets
            cut = np.argpartition(-dur[big], max_spans)[:max_spans]
            keep = np.zeros(len(idx), bool)
            keep[np.flatnonzero(big)[cut]] = True
            big = keep
        shown.append(idx[big])
        small = idx[~big]
        if len(small):
            s = np.maximum(spans.start[small], t0)
            e = np.minimum(spans.end[small], t1)
            bucket = np.clip(((s - t0) / width).astype(np.int64), 0, px - 1)
            count = np.bincount(bucket, minlength=px)
            busy = np.bincount(bucket, weights=(e - s).astype(np.float64), minlength=px)
            used = np.flatnonzero(count)
            bt.append(np.full(len(used), k))
            # Edges in integer ns: an absolute clock (time.time_ns) as float64 would be off by hundreds of ns.
            bs.append(t0 + np.floor(used * width).astype(np.int64))
            be.append(t0 + np.ceil((used + 1) * width).astype(np.int64))
            bc.append(count[used])
            bb.append(busy[used])
            if match is not None:
                bh.append(np.bincount(bucket, weights=match[spans.label[small]], minlength=px)[used])
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    return Lod(t0=t0, t1=t1, shown=cat(shown, np.int64), b_track=cat(bt, np.int64), b_start=cat(bs, np.int64),
               b_end=cat(be, np.int64), b_count=cat(bc, np.int64), b_busy=cat(bb, np.float64),
               b_hits=cat(bh, np.int64) if bh else np.zeros(sum(len(x) for x in bt), np.int64), visible=visible,
               hits=hits)


def _overlapping(spans: Spans, k: int, t0: int, t1: int) -> np.ndarray:
    """Indices of track k's spans that overlap [t0, t1] (those that began before t0 included)."""
    a, b = int(spans.offsets[k]), int(spans.offsets[k + 1])
    starts = spans.start[a:b]
    lo = a + int(np.searchsorted(starts, t0 - spans.maxdur[k], "left"))
    hi = a + int(np.searchsorted(starts, t1, "right"))
    idx = np.arange(lo, hi)
    return idx[spans.end[lo:hi] >= t0]


def in_window(spans: Spans, t0: int, t1: int, top: int = 12) -> dict:
    """What the window holds, by name: calls and time inside it (spans cut at its edges), biggest first.

    Time is inclusive: a nested op's time is also in its parent's, as in every trace viewer's summary.
    Python frames are left out (they are samples of the host, not work). `window` is the window's length
    within the run: the share a row shows is of it (a step's ProfilerStep# reads 100 %), since a share of the
    rows' sum would count a nested op's time once per level (20 % for the whole step, in issue 27's trace).
    `lanes`: how many tracks each row's spans lie on; its share is per lane (two ranks in all_reduce for half
    the window each read 50 %, not 100 %), so no row passes 100 %."""
    n = len(spans.names)
    total, count, lanes = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64)
    for k in range(len(spans.tracks)):
        idx = _overlapping(spans, k, t0, t1)
        cut = (np.minimum(spans.end[idx], t1) - np.maximum(spans.start[idx], t0)).astype(np.float64)
        inside = (cut > 0) | (spans.start[idx] >= t0)        # not the ones that only touch the window's start
        idx, cut = idx[inside], cut[inside]
        total += np.bincount(spans.label[idx], weights=cut, minlength=n)
        here = np.bincount(spans.label[idx], minlength=n)
        count += here
        lanes += here > 0
    total[spans.frames_from:] = 0
    count[spans.frames_from:] = 0
    order = [int(i) for i in np.argsort(-total, kind="stable")[:top] if count[i]]
    window = max(0, min(t1, spans.t_max) - max(t0, spans.t_min))
    return {"label": order, "count": count[order].tolist(), "total": total[order].tolist(),
            "busy": float(total.sum()), "window": float(window), "lanes": lanes[order].tolist()}


def b64(a, dtype) -> str:
    """A numpy array as base64 little-endian bytes: what the browser turns into a typed array in one step."""
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode("ascii")


def unb64(text: str, dtype) -> np.ndarray:
    """The numpy array back from `b64` (tests)."""
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype).newbyteorder("<"))


def payload(spans: Spans, lod: Lod) -> dict:
    """One window's level of detail as the browser's timeline draws it (assets/timeline.js).

    Times are ns since the run's first span, as float64: absolute clocks (time.time_ns) are past
    2**53 and would lose digits in JavaScript numbers; offsets stay exact for 104 days of run.
    A span row is [start, end, track, label, key0, key1]; a bucket row is [start, end, track, count, busy ns].
    """
    origin = spans.t_min
    shown = lod.shown
    rel = (lambda a: (np.asarray(a, np.int64) - origin).astype(np.float64))
    colors = span_colors(spans)
    # the legend names a kernel, a phase and an annotation itself (each has its own color), anything else by its op
    legend = [n if g in ("kernel", "phase", "annotation") else g for n, g in zip(spans.names, spans.groups)]
    top = in_window(spans, lod.t0, lod.t1)
    flows = _flows_in(spans, lod.t0, lod.t1)
    return {
        "origin": str(origin), "t0": lod.t0 - origin, "t1": lod.t1 - origin, "end": spans.t_max - origin,
        "tracks": spans.tracks, "clocks": spans.clocks or [None] * len(spans.tracks), "names": spans.names,
        "colors": colors, "groups": spans.groups, "legend": legend,
        "frames_from": spans.frames_from,
        "count": spans.count, "visible": lod.visible, "top": top,
        "spans": {"n": len(shown), "start": b64(rel(spans.start[shown]), "f8"), "end": b64(rel(spans.end[shown]), "f8"),
                  "track": b64(_track_of(spans, shown), "i4"), "label": b64(spans.label[shown], "i4"),
                  "key0": b64(spans.key0[shown], "f8"), "key1": b64(spans.key1[shown], "f8")},
        "buckets": {"n": len(lod.b_track), "start": b64(rel(lod.b_start), "f8"), "end": b64(rel(lod.b_end), "f8"),
                    "track": b64(lod.b_track, "i4"), "count": b64(lod.b_count, "f8"), "busy": b64(lod.b_busy, "f8"),
                    "hits": b64(lod.b_hits, "f8")},
        "flows": {"n": len(flows), "from": b64(rel(flows[:, 0]), "f8"), "from_track": b64(flows[:, 1], "i4"),
                  "to": b64(rel(flows[:, 2]), "f8"), "to_track": b64(flows[:, 3], "i4")},
    }


MAX_FLOWS = 5000       # arrows sent per window: those with an end inside it, the earliest first


def _flows_in(spans: Spans, t0: int, t1: int) -> np.ndarray:
    """An import's flows with an end in [t0, t1]: the browser draws those that touch the picked span."""
    f = spans.flows if spans.flows is not None else np.zeros((0, 4), np.int64)
    inside = ((f[:, 0] >= t0) & (f[:, 0] <= t1)) | ((f[:, 2] >= t0) & (f[:, 2] <= t1))
    return f[inside][:MAX_FLOWS]


def span_colors(spans: Spans) -> list[str]:
    """Per name, its color: the op's, a phase's, a step's; the run's busiest kernels each a color of their own
    (worked out once per Spans: the payload of every zoom window carries them)."""
    if spans.colors is None:
        kernels = [i for i, g in enumerate(spans.groups) if g == "kernel"]
        busy = np.bincount(spans.label, weights=(spans.end - spans.start).astype(np.float64),
                           minlength=len(spans.names)) if kernels else np.zeros(0)
        own = theme.kernel_colors(spans.names[i] for i in sorted(kernels, key=lambda i: (-busy[i], spans.names[i])))
        spans.colors = [PHASE_COLORS.get(n, "#94a3b8") if g == "phase" else own.get(n) or theme.span_color(n, g)
                        for n, g in zip(spans.names, spans.groups)]
    return spans.colors


def counter_payload(counters: list[dict], origin: int, t0: int, t1: int, px: int = PX) -> list[dict]:
    """The counter tracks for one window: each series' samples inside it (and one either side, so the line
    reaches the edges), past 2 px per sample thinned to each pixel's lowest and highest sample."""
    out = []
    for c in counters:
        t, v = c["t"], c["v"]
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        lo = max(int(np.searchsorted(t, t0, "left")) - 1, 0)
        hi = min(int(np.searchsorted(t, t1, "right")) + 1, len(t))
        t, v = t[lo:hi], v[lo:hi]
        if len(t) > 2 * px:
            t, v = _thinned(t, v, ((t - t0) * px // max(t1 - t0, 1)).astype(np.int64))
        finite = np.isfinite(c["v"])
        out.append({"name": c["name"], "unit": c["unit"], "t": b64((t - origin).astype(np.float64), "f8"),
                    "v": b64(np.nan_to_num(v, nan=0.0), "f8"), "n": len(t),
                    "max": float(np.max(c["v"][finite])) if finite.any() else 0.0})
    return out


def _thinned(t: np.ndarray, v: np.ndarray, bucket: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket (ascending), its lowest and highest finite sample, the first of equals (a bucket with none:
    its first sample). Vectorized: one stable sort per side instead of a loop over thousands of pixels."""
    finite = np.isfinite(v)
    keep = np.zeros(len(t), bool)
    for key in (np.where(finite, v, np.inf), np.where(finite, -v, np.inf)):
        order = np.lexsort((~finite, key, bucket))       # per bucket: finite first, smallest key, first index
        first = np.r_[True, bucket[order][1:] != bucket[order][:-1]]
        keep[order[first]] = True
    return t[keep], v[keep]


def matching(spans: Spans, text: str) -> np.ndarray:
    """Per name: does it contain the search text (case-insensitive)? Op names, kernel names and Python frames."""
    needle = text.strip().lower()
    return np.array([needle in n.lower() for n in spans.names], dtype=bool)


def next_match(spans: Spans, match: np.ndarray, after: int, forward: bool = True) -> int | None:
    """The index of the first matching span starting after `after` (ns), or the last one before it."""
    idx = np.flatnonzero(match[spans.label])
    if not len(idx):
        return None
    starts = spans.start[idx]
    pick = idx[starts > after] if forward else idx[starts < after]
    if not len(pick):
        return None
    s = spans.start[pick]
    return int(pick[np.argmin(s)] if forward else pick[np.argmax(s)])


def _track_of(spans: Spans, idx: np.ndarray) -> np.ndarray:
    return np.searchsorted(spans.offsets, idx, "right") - 1
