"""The timeline's area selection: the ops inside a time range on the tracks dragged over, summed (Perfetto's area
selection). assets/timeline_tools.js draws the area (and the pins and the measure) and writes TL_AREA; this module
answers with the table under the timeline.

    rows, head = area_summary(spans, t0, t1, tracks)    # absolute ns, track indices as the server orders them

Per op name: how many spans lie in the area, their time in it (each cut at the area's edges; inclusive, so a
nested op's time is also in its parent's) and their self time in it (less the time of the spans one lane down on
the same thread inside it: what the op spent itself). The share is of the area's self time, which
counts each instant of a thread once: the rows add up to 100 %, and none can pass it.
"""
from __future__ import annotations

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs
from opscope.app.web import timeline as lod

NESTED = "\u21b3"        # data.py labels a thread's deeper lanes "↳ …", right under the thread's first lane


def layout_parts():
    """What the timeline page holds for the area: the store the browser writes, and the card of the summary."""
    return [dcc.Store(id=ids.TL_AREA),
            ui.card("Area selection", html.Div(id=ids.TL_AREA_OUT, children=_hint()))]


def _hint():
    return ui.note("Pick \"select area\" above the timeline (or hold Alt) and drag across tracks and time: the ops "
                   "inside are summed here, with their self time and share of the area.")


def register(app, data):
    @app.callback(Output(ids.TL_AREA_OUT, "children"), Input(ids.TL_AREA, "data"), prevent_initial_call=True)
    def summary(area):
        area = inputs.area(area)
        if not area:
            return _hint()
        run = data.run(area["run"])
        if run is None or run["run_id"] != area["run"]:
            return ui.note(f"No run {area['run']!r} in this store.", "warn")
        spans = data.spans(run)
        # ns since the first span, cut to the run's time: any finite number passes inputs.area, 1e300 included
        t0, t1 = (spans.t_min + int(min(max(area[k], 0), spans.t_max - spans.t_min)) for k in ("t0", "t1"))
        tracks = [k for k in area["tracks"] if isinstance(k, int) and 0 <= k < len(spans.tracks)]
        rows, head = area_summary(spans, t0, t1, tracks)
        return render(rows, head, spans)


def thread_groups(tracks: list[str], bands: int = 0) -> np.ndarray:
    """Per track, the first track of its thread: a "↳" lane belongs to the track above it."""
    g = np.arange(len(tracks))
    for k in range(1, len(tracks)):
        if k >= bands and tracks[k].startswith(NESTED):
            g[k] = g[k - 1]
    return g


def area_summary(spans: lod.Spans, t0: int, t1: int, tracks) -> tuple[list[dict], dict]:
    """Rows per name (biggest self time first) and the area's head: its length, tracks, spans, self time."""
    t0, t1 = int(t0), int(max(t1, t0 + 1))
    n = len(spans.names)
    count, total, own = np.zeros(n, np.int64), np.zeros(n), np.zeros(n)
    groups = thread_groups(spans.tracks, spans.bands)
    picked = sorted({int(k) for k in tracks if spans.bands <= int(k) < len(spans.tracks)})
    threads, spans_in = set(), 0
    for k in picked:
        idx = lod._overlapping(spans, k, t0, t1)
        idx = idx[spans.label[idx] < spans.frames_from]          # Python frames are samples, not work: the flame graph
        if not len(idx):
            continue
        s, e = np.maximum(spans.start[idx], t0), np.minimum(spans.end[idx], t1)
        inside = (e > s) | (spans.start[idx] >= t0)
        idx, s, e = idx[inside], s[inside], e[inside]
        cut = (e - s).astype(np.float64)
        mine = cut - _children_time(spans, k, groups, s, e)
        np.add.at(count, spans.label[idx], 1)
        np.add.at(total, spans.label[idx], cut)
        np.add.at(own, spans.label[idx], np.maximum(mine, 0.0))
        threads.add(int(groups[k]))
        spans_in += len(idx)
    busy = float(own.sum())
    order = [int(i) for i in np.argsort(-own, kind="stable") if count[i]]
    rows = [{"label": i, "name": spans.names[i], "count": int(count[i]), "total": float(total[i]),
             "self": float(own[i]), "share": float(100.0 * own[i] / busy) if busy > 0 else 0.0} for i in order]
    clocks = sorted({spans.clocks[k] for k in picked if spans.clocks and spans.clocks[k]})
    head = {"t0": t0, "t1": t1, "length": t1 - t0, "tracks": len(picked), "threads": len(threads), "spans": spans_in,
            "busy": busy, "picked": picked, "clocks": clocks}
    return rows, head


def _children_time(spans: lod.Spans, k: int, groups: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per span [s, e) of track k (already cut to the area): the time of the spans on the lane below (the next
    track, if it is the same thread's) inside it, each cut to it."""
    below = k + 1
    if below >= len(spans.tracks) or groups[below] != groups[k]:
        return np.zeros(len(s))
    a, b = int(spans.offsets[below]), int(spans.offsets[below + 1])
    cs, ce = spans.start[a:b], spans.end[a:b]            # one lane: sorted by start, and so by end
    if not len(cs) or not len(s):
        return np.zeros(len(s))
    # vectorized (a whole-run area of a million spans): every child between the first that ends after the span's
    # start and the last that starts before its end counts whole (cut to the area), less the first one's part
    # before the span and the last one's part after it
    c0, c1 = np.maximum(cs, s.min()), np.minimum(ce, e.max())
    d = np.maximum(c1 - c0, 0).astype(np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(d)])
    lo = np.searchsorted(ce, s, "right")
    hi = np.searchsorted(cs, e, "left")
    out = prefix[np.maximum(hi, lo)] - prefix[lo]
    has = hi > lo
    first, last = np.minimum(lo, len(cs) - 1), np.maximum(hi - 1, 0)
    out -= np.where(has, np.clip(s - c0[first], 0, d[first]), 0)
    out -= np.where(has, np.clip(c1[last] - e, 0, d[last]), 0)
    return np.maximum(out, 0)


def render(rows: list[dict], head: dict, spans: lod.Spans):
    if not rows:
        return ui.note(f"Nothing ran in this area ({ui.fmt_ns(head['length'])} on {head['tracks']} track"
                       f"{'s' if head['tracks'] != 1 else ''}): drag over spans to sum them.")
    colors = lod.span_colors(spans)
    picked = head["picked"]           # the op tracks (a band of steps or phases holds no ops)
    where = ", ".join(spans.tracks[k] for k in picked[:3]) + (f" and {len(picked) - 3} more" if len(picked) > 3 else "")
    line = html.P(className="area-head", children=[
        html.B(ui.fmt_ns(head["length"])), f" from {ui.fmt_ns(head['t0'] - spans.t_min)} · ",
        html.B(f"{head['tracks']}"), f" track{'s' if head['tracks'] != 1 else ''} ({where}) · ",
        html.B(f"{head['spans']:,}"), " spans · self time ", html.B(ui.fmt_ns(head["busy"])),
        html.Span(" · time: inclusive, cut at the area's edges · self: less the lane below · share: of the area's "
                  "self time (the rows add up to 100 %)", className="muted"),
        html.Span(f" · {' and '.join(head['clocks'])} clock" if head.get("clocks") else "", className="muted")])
    data = [{"id": str(r["label"]), "name": r["name"], "count": r["count"], "total": r["total"], "self": r["self"],
             "share": r["share"], "swatch": colors[r["label"]]} for r in rows]
    return html.Div([line, ui.table(ids.TL_AREA_OUT + "-grid", [
        ("name", "op", ui.SWATCH), ("count", "spans", ui.NUM), ("total", "time in area", ui.DURATION),
        ("self", "self time", ui.DURATION), ("share", "share of area %", ui.num(".1f"))], data,
        sort_by=("self", "desc"), page_size=15)])
