"""Level of detail for the timeline: a run of a million spans becomes a figure of a few thousand.

At a zoom window [t0, t1] drawn `px` pixels wide, a span shorter than one pixel cannot be seen on
its own. Those spans are summed into per-pixel buckets (how many, how busy) and drawn as one gray
segment per bucket; spans at least a pixel wide are drawn as themselves, the widest first, up to
`max_spans` per track. Spans are WebGL line segments (Scattergl, `None` separators), one trace per
op type, so the browser draws one buffer per color instead of one shape per span.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

from . import theme

PX = 1400              # buckets across the window: about the plot's width in pixels
MAX_SPANS = 2000       # individually drawn spans per track at any zoom
ROW_PX = 30            # height of one track
STACK_KEY = -2         # key0 of a Python-stack span (events use key0 = step >= 0)


@dataclass
class Spans:
    """A run's spans grouped by track, sorted by start inside each track."""
    tracks: list[str]          # track labels, top to bottom
    offsets: np.ndarray        # spans of track k are [offsets[k], offsets[k+1])
    start: np.ndarray          # int64 ns
    end: np.ndarray
    label: np.ndarray          # int32 index into names
    names: list[str]           # op names, then Python frames
    key0: np.ndarray           # step (or STACK_KEY for a Python frame)
    key1: np.ndarray           # seq (or the frame's row)
    maxdur: np.ndarray         # per track: the longest span, to find spans that began before t0
    t_min: int
    t_max: int

    @property
    def count(self) -> int:
        return len(self.start)


def build(start, end, track, tracks, label, names, key0, key1) -> Spans:
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
                 key0=np.asarray(key0, dtype=np.int64)[order], key1=np.asarray(key1, dtype=np.int64)[order],
                 maxdur=maxdur, t_min=int(start.min()) if len(start) else 0,
                 t_max=int(end.max()) if len(end) else 1)


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
    visible: int               # spans overlapping the window


def level_of_detail(spans: Spans, t0: int, t1: int, px: int = PX, max_spans: int = MAX_SPANS) -> Lod:
    t0, t1 = int(t0), int(max(t1, t0 + 1))
    width = (t1 - t0) / px
    shown, bt, bs, be, bc, bb = [], [], [], [], [], []
    visible = 0
    for k in range(len(spans.tracks)):
        a, b = int(spans.offsets[k]), int(spans.offsets[k + 1])
        starts = spans.start[a:b]
        lo = a + int(np.searchsorted(starts, t0 - spans.maxdur[k], "left"))
        hi = a + int(np.searchsorted(starts, t1, "right"))
        idx = np.arange(lo, hi)
        idx = idx[spans.end[lo:hi] >= t0]
        visible += len(idx)
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
            bs.append(t0 + used * width)
            be.append(t0 + (used + 1) * width)
            bc.append(count[used])
            bb.append(busy[used])
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    return Lod(t0=t0, t1=t1, shown=cat(shown, np.int64), b_track=cat(bt, np.int64), b_start=cat(bs, np.float64),
               b_end=cat(be, np.float64), b_count=cat(bc, np.int64), b_busy=cat(bb, np.float64), visible=visible)


def typed(a, dtype) -> dict:
    """A numpy array as plotly's typed-array spec (base64 bytes; plotly.js >= 2.28 decodes it).

    NOTE: Dash stores figure props in its client-side state and walks them on every update; a
    base64 string is one value where a list of 100k numbers is 100k, so this is what keeps zoom
    and live updates fast, besides being 2-3x smaller than JSON numbers."""
    a = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
    spec = {"dtype": np.dtype(dtype).str.lstrip("<>|="), "bdata": base64.b64encode(a.tobytes()).decode("ascii")}
    if a.ndim > 1:
        spec["shape"] = ",".join(map(str, a.shape))
    return spec


def untyped(spec) -> np.ndarray:
    """The numpy array back from `typed` (tests, and figures that come back from the browser)."""
    if not isinstance(spec, dict):
        return np.asarray(spec)
    a = np.frombuffer(base64.b64decode(spec["bdata"]), dtype=np.dtype(spec["dtype"]).newbyteorder("<"))
    return a.reshape([int(x) for x in spec["shape"].split(",")]) if spec.get("shape") else a


def _trace(name, xs, ys, cd, color, width, hovertemplate):
    # x in float64: a deep zoom into a long run needs the digits. Rows, step/seq keys and microseconds
    # fit float32 exactly up to 2**24, which is every key a run has but the seq of a 16M-op step.
    exact32 = not len(cd) or float(np.nanmax(np.abs(cd[:, :2]))) < 2**24
    return dict(type="scattergl", mode="lines", name=name, x=typed(xs, "f8"), y=typed(ys, "f4"),
                customdata=typed(cd, "f4" if exact32 else "f8"), line=dict(color=color, width=width),
                connectgaps=False,
                hovertemplate=hovertemplate)


def _segments(x0, x1, y, custom, origin):
    """Span i becomes the vertices start, middle, end, gap: a click anywhere on it finds a vertex."""
    n = len(x0)
    xs = np.full(4 * n, np.nan)
    x0 = (np.asarray(x0, np.float64) - origin) / 1e6
    x1 = (np.asarray(x1, np.float64) - origin) / 1e6
    xs[0::4], xs[1::4], xs[2::4] = x0, (x0 + x1) / 2, x1
    ys = np.full(4 * n, np.nan)
    for j in range(3):
        ys[j::4] = y
    cd = np.repeat(np.asarray(custom, np.float64), 4, axis=0)
    return xs, ys, cd


def figure(spans: Spans, lod: Lod, title: str = "") -> dict:
    """The plotly figure for one window; x is milliseconds since the run's first span."""
    origin = spans.t_min
    traces = []
    shown = lod.shown
    width = max(4, ROW_PX - 8)
    if len(shown):
        labels = spans.label[shown]
        is_stack = spans.key0[shown] == STACK_KEY
        for code in np.unique(labels[~is_stack]):
            sel = shown[(labels == code) & ~is_stack]
            name = spans.names[code]
            custom = np.stack([spans.key0[sel], spans.key1[sel], (spans.end[sel] - spans.start[sel]) / 1e3], 1)
            xs, ys, cd = _segments(spans.start[sel], spans.end[sel], _track_of(spans, sel), custom, origin)
            traces.append(_trace(name, xs, ys, cd, theme.op_color(name), width,
                                 f"<b>{name}</b><br>%{{customdata[2]:.1f}} us · step %{{customdata[0]}}"
                                 f" · #%{{customdata[1]}}<extra></extra>"))
        sel = shown[is_stack]
        if len(sel):
            custom = np.stack([spans.key0[sel], spans.key1[sel], (spans.end[sel] - spans.start[sel]) / 1e3], 1)
            xs, ys, cd = _segments(spans.start[sel], spans.end[sel], _track_of(spans, sel), custom, origin)
            # Frame names vary per span, so they ride as text (py-spy gives thousands of samples, not millions).
            text = np.repeat(np.array([spans.names[c] for c in spans.label[sel]], dtype=object), 4).tolist()
            traces.append(_trace("python frame", xs, ys, cd, theme.STACK, width,
                                 "%{text}<br>%{customdata[2]:.1f} us<extra>python</extra>"))
            traces[-1]["text"] = text
    if len(lod.b_track):
        custom = np.stack([np.full(len(lod.b_track), -1.0), lod.b_count, lod.b_busy / 1e3], 1)
        xs, ys, cd = _segments(lod.b_start, lod.b_end, lod.b_track, custom, origin)
        traces.append(_trace("too small to draw (zoom in)", xs, ys, cd, theme.AGGREGATE, width,
                             "%{customdata[1]} spans too small to draw<br>busy %{customdata[2]:.1f} us"
                             "<extra>zoom in</extra>"))
    n = max(1, len(spans.tracks))
    lay = theme.layout(
        height=90 + ROW_PX * n + 40, showlegend=True, dragmode="zoom", hovermode="closest", hoverdistance=30,
        uirevision="timeline", margin=dict(l=150, r=20, t=40, b=40),
        xaxis=dict(title=dict(text="time since first op (ms)"), range=[(lod.t0 - origin) / 1e6, (lod.t1 - origin) / 1e6],
                   showgrid=True),
        yaxis=dict(tickvals=list(range(n)), ticktext=spans.tracks, range=[n - 0.5, -0.5], fixedrange=True,
                   showgrid=False, zeroline=False),
        title=dict(text=title, font=dict(size=13), x=0, xanchor="left") if title else None)
    return {"data": traces, "layout": lay}


def _track_of(spans: Spans, idx: np.ndarray) -> np.ndarray:
    return np.searchsorted(spans.offsets, idx, "right") - 1


def window_from_relayout(relayout: dict | None, spans: Spans, current: tuple[int, int] | None = None):
    """The zoom window, in ns, from a dcc.Graph relayoutData (x in ms since t_min); None = whole run."""
    if not relayout:
        return current
    if relayout.get("xaxis.autorange"):
        return None
    rng = relayout.get("xaxis.range")
    lo, hi = (rng if rng else (relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")))
    if lo is None or hi is None:
        return current
    return (spans.t_min + int(float(lo) * 1e6), spans.t_min + int(float(hi) * 1e6))
