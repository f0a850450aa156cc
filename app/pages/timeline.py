"""Timeline: one track per backend/device/thread (and Python stacks when py-spy ran).

The browser draws it (assets/timeline.js, WebGL): zoom with the wheel, W/S or a drag, pan with A/D
or shift+drag, double-click for the whole run. Each view change redraws at once from the spans the
browser holds, then asks `/_opscope/timeline` for the new window's level of detail, so the browser
never holds more than a few thousand spans per track however long the run.
"""
from __future__ import annotations

import json
import math

import numpy as np
import orjson
from dash import Input, Output, State, dcc, html, no_update

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme
from opscope.app.web import timeline as lod
from opscope.app.web.data import page_data
from opscope.app.web.errors import one_line

from . import timeline_tools
from opscope.profiler.importers.kineto import DEVICE_OPS

PATH = "/timeline"
NAME = "Timeline"
ENDPOINT = "/_opscope/timeline"   # GET ?run=&step=&t0=&t1=&px=: one window's level of detail (JSON)
LIVE_ENDPOINT = "/_opscope/live_spans"   # GET ?run=&since=N: the op spans stored after the first N (JSON)
LIVE_WAIT_S = 5.0          # the longest a live answer waits for a new span (?wait=): a thread of the server each
VIEW, PICKED, FORWARD, FORWARD_TARGET = ids.TL_VIEW, ids.TL_PICKED, ids.TL_FORWARD, ids.TL_FORWARD_TARGET
_MAX_OFFSET = 2.0 ** 53           # t0, t1, at past this would overflow int64 ns once the run's clock is added

_SELECT_JS = """function (n, target) {
  if (n && window.opscopeTimeline) window.opscopeTimeline.select(target);
  return window.dash_clientside.no_update;
}"""

# The browser's canvas follows VIEW: a new stamp (more events, a new status) redraws the same zoom window,
# a new step or run starts from that step's or run's whole window.
_FOLLOW_JS = """function (view) {
  if (window.opscopeTimeline) window.opscopeTimeline.follow(view);
  return window.dash_clientside.no_update;
}"""


def layout(run=None, step=None, find=None, **_query):
    """The page shell: the canvas fetches its spans itself (timeline.js), so this stays cheap for any run."""
    run, step, find = inputs.query(run, "run"), inputs.query(step, "step"), inputs.query(find, "find")
    data = page_data()
    shown = data.run(run) if data else None
    windows = data.step_windows(shown["run_id"], shown) if data and shown else []
    step = next((s for s, _, _ in windows if str(s) == str(step)), "all")
    view = _view(shown["run_id"], _stamp(shown["run_id"], data.arrived(shown), shown.get("status")), step, find) \
        if shown else None
    return html.Div([
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("step", className="label"),
            dcc.Dropdown(id=ids.TL_STEP, options=_step_options(windows), value=step, clearable=False,
                         className="dropdown small"),
            dcc.Input(id=ids.TL_FIND, type="search", value=find or "", debounce=True, className="find",
                      placeholder="find an op or kernel…"),
            html.Span("", id=ids.TL_INFO, className="muted info"),
            html.Span([html.Kbd("W"), html.Kbd("S"), " zoom · ", html.Kbd("A"), html.Kbd("D"),
                       " pan · drag: zoom to a range · double-click: whole run · in find, ", html.Kbd("Enter"),
                       ": next match"],
                      className="hint"),
        ]), html.Div(id=ids.TL_GRAPH, className="timeline-canvas",
                     children=ui.note(_missing(run)) if shown is None else None),
                dcc.Store(id=VIEW, data=view), dcc.Store(id=PICKED), dcc.Store(id=FORWARD_TARGET)),
        ui.card("Span", html.Div(ui.note("Click a span to see its op, shapes, dtypes, FLOPs, module and source."),
                                 id=ids.TL_DETAILS)),
        *timeline_tools.layout_parts(),
    ])


def _missing(run_id) -> str:
    if run_id:
        return f"No run {run_id!r} in this store: the Runs page lists the runs there are."
    return "No runs yet: `opscope profile MODEL` records one."


def _stamp(run_id: str, arrived: int, status: str | None) -> str:
    """What changes when the canvas must redraw: the run, its events stored so far, its status."""
    return f"{run_id}:{arrived}:{status}"


def _view(run_id: str, stamp: str, step, find="") -> dict:
    return {"run": run_id, "stamp": stamp, "step": step, "find": (find or "").strip()}


def _step_options(windows) -> list[dict]:
    return [{"label": "all steps", "value": "all"}] + [{"label": f"step {s}", "value": s} for s, _, _ in windows]


def window(data, query) -> tuple[dict, int]:
    """The endpoint's answer for a query string: (JSON-able dict, HTTP status)."""
    try:
        px = int(query.get("px") or lod.PX)
        t0, t1, at = (float(query[k]) if query.get(k) not in (None, "") else None for k in ("t0", "t1", "at"))
    except ValueError:
        return {"error": "t0, t1, at (ns since the run's first span) and px (pixels) must be numbers"}, 400
    if any(v is not None and not abs(v) <= _MAX_OFFSET for v in (t0, t1, at)):     # NaN fails the test too
        return {"error": "t0, t1 and at must be finite, within 2**53 ns (104 days) of the run's first span"}, 400
    find, goto = (query.get("find") or "").strip(), query.get("goto")
    if goto not in (None, "", "next", "prev"):
        return {"error": "goto is next or prev"}, 400
    run = data.run(query.get("run") or None)
    if run is None:
        return {"run": None, "message": _missing(query.get("run"))}, 200
    arrived = data.arrived(run)         # one count for the stamp and the span cache (a live run's is a query)
    status = run.get("status")
    out = {"run": run["run_id"], "stamp": _stamp(run["run_id"], arrived, status), "status": status}
    spans = data.spans(run, arrived)
    out["events"] = spans.events        # a live page asks /_opscope/live_spans for those after these
    if spans.count == 0:
        out["message"] = {"running": "The run has started; its first ops have not arrived yet.",
                          "failed": f"The run failed before its first op: {run.get('error') or ''}"}.get(
            run.get("status"), "This run recorded no events.")
        return out, 200
    match = lod.matching(spans, find) if find else None
    if goto:
        return (_goto(spans, match, at, goto == "next", out), 200) if match is not None else \
            ({"error": "goto needs find: the text to search for"}, 400)
    step = query.get("step")
    if t0 is not None and t1 is not None and t1 > t0:
        a, b = spans.t_min + int(t0), spans.t_min + int(math.ceil(t1))
    elif step not in (None, "", "all"):
        a, b = next(((s0, s1) for s, s0, s1 in data.step_windows(run["run_id"], run) if str(s) == str(step)),
                    (spans.t_min, spans.t_max))
    else:
        a, b = spans.t_min, spans.t_max + max(1, (spans.t_max - spans.t_min) // 100)
    px = min(max(px, 50), 8000)
    view = lod.level_of_detail(spans, a, b, px=px, match=match)
    out.update(lod.payload(spans, view))
    out["counters"] = lod.counter_payload(data.counters(run), spans.t_min, a, b, px)
    out["breaks"] = [[t - spans.t_min, gap] for t, gap in data.breaks(run)]
    out["clock"] = _clock_caption(data.clocks(run), bool(out["breaks"]))
    out["info"] = (f"{view.visible:,} of {spans.count:,} spans in view · {len(view.shown):,} drawn"
                   + (f" · {len(view.b_track):,} pixel buckets" if len(view.b_track) else ""))
    if match is not None:
        out["find"] = find
        out["matched"] = np.flatnonzero(match).tolist()
        total = int(match[spans.label].sum())
        out["info"] += f" · {total:,} match{'es' if total != 1 else ''} for {find!r} ({view.hits:,} in view)"
    return out, 200


def _clock_caption(clocks: dict, breaks: bool) -> str:
    """What the axis measures, per kind of track: one clock each, said once under the axis."""
    parts = [ui.clock_caption(clocks)] if clocks else []
    if breaks:
        parts.append("host time between simulated steps collapsed (dashed lines)")
    return " · ".join(parts)


def _goto(spans, match, at, forward: bool, out: dict) -> dict:
    """The next (or previous) span matching the search, from `at` ns since the first span; the client centers it."""
    after = spans.t_min + int(at) if at is not None else (spans.t_min - 1 if forward else spans.t_max + 1)
    i = lod.next_match(spans, match, after, forward)
    if i is None:           # past the last one: wrap around, the way an editor's find does
        i = lod.next_match(spans, match, spans.t_min - 1 if forward else spans.t_max + 1, forward)
    if i is None:
        return {**out, "goto": None}
    return {**out, "goto": {"start": int(spans.start[i] - spans.t_min), "end": int(spans.end[i] - spans.t_min),
                            "key": [int(spans.key0[i]), int(spans.key1[i]),
                                    (int(spans.end[i]) - int(spans.start[i])) / 1e3],
                            "name": spans.names[spans.label[i]]}}


def live_spans(data, query) -> tuple[dict, int]:
    """The live endpoint's answer: the spans that arrived after the first `since` (what the page has), so a
    page following a run asks for what changed instead of the whole run on every new event. `origin`: the
    page's first span (the window answer's "origin"), so times come relative to it as the page draws them.
    `wait` (seconds, at most LIVE_WAIT_S): a long poll: the live run's answer waits until a span past `since`
    has arrived (or the run ends), so a page asks again as soon as it has drawn and hears of each batch when it
    arrives, not a poll interval later."""
    try:
        since = int(query.get("since") or 0)
        origin = int(query["origin"]) if query.get("origin") not in (None, "") else None
    except ValueError:
        return {"error": "since is a count of spans the page already has, origin a time in ns: whole numbers"}, 400
    try:
        wait = float(query.get("wait") or 0)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= LIVE_WAIT_S:                                # NaN fails the test too
        return {"error": f"wait is in seconds: 0 to {LIVE_WAIT_S:g}"}, 400
    if not 0 <= since < 2 ** 63:                                    # echoed in the answer: JSON's int64
        return {"error": "since is a count of spans the page already has: 0 or more, under 2^63"}, 400
    if origin is not None and not -2**62 <= origin <= 2**62:      # subtracted from int64 times below
        return {"error": "origin is a time in ns: within ±2^62"}, 400
    rid = query.get("run") or None
    tail = data.live_tail(rid) if rid and wait else None
    if tail is not None:
        tail.wait(since, wait)
    now = data.live_status(rid) if rid else None       # the live run: its counters, no store query per poll
    run = data.run_info(rid, now["status"]) if now else data.run(rid)
    if run is None:
        return {"run": None, "message": _missing(query.get("run"))}, 200
    if now:
        run = {**run, "status": now["status"], "events": now["events"]}
    return {"run": run["run_id"], "status": run.get("status"), **data.live_spans(run, since, origin)}, 200


def register(app, data):
    from flask import Response, request

    def endpoint():
        try:
            body, status = window(data, request.args)
        except Exception as e:        # one line for the page to show (never a stuck canvas); the traceback to the log
            app.server.logger.error("timeline window failed", exc_info=e)
            body, status = {"error": f"the server failed to build this window: {one_line(e)}"}, 500
        return Response(orjson.dumps(body), status=status, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    app.server.add_url_rule(ENDPOINT, "opscope_timeline", endpoint)

    def live_endpoint():
        body, status = live_spans(data, request.args)
        return Response(orjson.dumps(body), status=status, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    app.server.add_url_rule(LIVE_ENDPOINT, "opscope_live_spans", live_endpoint)
    timeline_tools.register(app, data)          # area selection's summary (pins and measure live in the browser)

    # Two callbacks: the canvas's VIEW needs no store query, so a live run's new events reach the canvas without
    # waiting for the step list's (which took 0.6-1.2 s a tick while the collector wrote, issue 27's live lag)
    @app.callback(Output(VIEW, "data"),
                  Input(ids.RUN_STATUS, "data"), Input(ids.TL_STEP, "value"), Input(ids.TL_FIND, "value"),
                  State(VIEW, "data"), prevent_initial_call=True)
    def follow(status, step, find, view):
        status, find, view = inputs.run_status(status), inputs.text(find, "find"), inputs.timeline_view(view)
        step = inputs.step(step)
        if not status:
            return None
        # The header's status callback has just looked the run up: its store says all the stamp needs.
        rid = status["run"]
        new = _view(rid, _stamp(rid, status["events"], status["status"]),
                    step if view and view.get("run") == rid else "all", find)
        return no_update if new == view else new    # the layout (or the last tick) showed this state already

    @app.callback(Output(ids.TL_STEP, "options"), Input(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    def steps(status):
        status = inputs.run_status(status)
        if not status:
            return no_update
        run = data.status_run(status)               # the row the header's lookup read: no store open of its own
        return _step_options(data.step_windows(run["run_id"], run) if run else [])

    app.clientside_callback(_FOLLOW_JS, Output(VIEW, "id"), Input(VIEW, "data"))
    app.clientside_callback(_SELECT_JS, Output(FORWARD, "title"), Input(FORWARD, "n_clicks"),
                            State(FORWARD_TARGET, "data"), prevent_initial_call=True)

    @app.callback(Output(ids.TL_DETAILS, "children"), Output(FORWARD_TARGET, "data"), Input(PICKED, "data"),
                  State(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    def details(cd, status):
        shown = _details(cd, status)
        return shown if isinstance(shown, tuple) else (shown, no_update)

    def _details(cd, status):
        status, cd = inputs.run_status(status), inputs.picked_span(cd)
        if not cd or not status:
            return no_update
        key0, key1 = int(cd[0]), int(cd[1])
        if key0 == -1:
            return ui.note(f"{key1:,} spans shorter than a pixel at this zoom ({cd[2]:.1f} us busy): zoom in "
                           "(W or drag) to see them one by one.")
        if key0 == lod.STEP_KEY:
            run = data.run(status["run"])
            row = next((r for r in data.times(run)["steps"] if r["step"] == key1), None) if run else None
            if row is None:
                return no_update
            return _fields([("step", key1), ("from first op to last", ui.fmt_ns(row["span_ns"])),
                            ("busy (any track)", ui.fmt_ns(row["busy_ns"])), ("host busy", ui.fmt_ns(row["host_ns"])),
                            ("device busy", ui.fmt_ns(row["device_ns"])), ("top-level ops", f"{row['ops']:,}")])
        if key0 == lod.PHASE_KEY:
            step, phase = divmod(key1, 8)
            if not 0 <= phase < len(lod.PHASES):
                raise inputs.BadInput("the picked phase is step * 8 + phase")
            return _fields([("phase", lod.PHASES[phase]), ("step", step),
                            ("from its first op to its last", ui.fmt_ns(cd[2] * 1e3))])
        if key0 == lod.STACK_KEY:
            f = data.stack_frame(status["run"], key1)
            return _fields([("Python frame", f["frame"]), ("depth", f["depth"]), ("thread", f["thread"]),
                            ("duration", ui.fmt_ns(f["dur_ns"]))]) if f else no_update
        if key0 == lod.ANNOTATION_KEY:
            a = data.annotation(status["run"], key1)
            return _fields([(a["kind"].replace("_", " "), a["name"]), ("duration", ui.fmt_ns(a["end_ns"] - a["start_ns"])),
                            ("where", f"{a['backend']} · {a['device'] or ''} · thread {a['thread']}"),
                            ("depth · step", f"{a['depth']} · {a['step']}"), ("args", a["args"] or "—")]) \
                if a else no_update
        ev = data.event(status["run"], key0, key1)
        if ev is None:
            return ui.note("That event is no longer in the store.", "warn")
        dur = max(1, ev["end_ns"] - ev["start_ns"])
        link, target = _forward_link(data, status["run"], ev)
        return html.Div(className="span-details", children=[
            html.H4([html.Span(className="swatch", style={"background": theme.span_color(ev["node"], ev["op"])}),
                     ev["op"],
                     html.Span(f"  {ui.fmt_ns(dur)}", className="muted")]),
            link,
            _fields([
                ("node", ev["node"]),
                ("launched by", ev["module"] or "unknown") if ev["op"] in DEVICE_OPS else
                ("module path", ev["module"] or "(top level)"),
                ("source line", ev["source"] or "unknown") if not ev.get("parent") else ("stack's op", ev["source"]),
                *([("inside", ev["parent"]), ("timed by", ev["clock"])] if ev.get("parent") else []),
                *_members(data, status["run"], ev),
                ("backend", f"{ev['backend']} · {ev['device'] or ''} · thread {ev['thread']}"),
                ("step · seq", f"{ev['step']} · {ev['seq']}"),
                ("input shapes", _pretty(ev["input_shapes"])), ("input dtypes", _pretty(ev["input_dtypes"])),
                ("output shapes", _pretty(ev["output_shapes"])), ("output dtypes", _pretty(ev["output_dtypes"])),
                *_work(ev, dur),
                ("fell back", "yes: the backend has no kernel for it" if ev["fallback"] else "no"),
                ("live bytes after", ui.fmt_bytes(ev["live_bytes"]) if ev["live_bytes"] is not None else "n/a"),
                *_kernel_args(data, status["run"], ev),
            ])]), target


# ops that move bytes and compute nothing: a FLOP count on them (a transfer's 8,192) is the recorder counting
# elements, and "1.23 GFLOP/s" on a copy reads as arithmetic it never did
_MOVES_ONLY = {"transfer", "copy", "copy_", "to", "clone", "contiguous", "memcpy"}


def _work(ev: dict, dur) -> list[tuple[str, str]]:
    """FLOPs and FLOP/s on compute ops; bytes and bandwidth on copies."""
    nbytes, secs = ev["bytes"] or 0, (dur or 0) / 1e9
    op = str(ev["op"] or "")
    if op in _MOVES_ONLY or op.lower().startswith("memcpy") or not (ev["flops"] or 0):
        return [("bytes moved", ui.fmt_bytes(nbytes)),
                ("achieved", f"{ui.fmt_bytes(nbytes / secs)}/s (a copy: no FLOPs)" if secs > 0 else "n/a")]
    return [("FLOPs", f"{int(ev['flops']):,}"), ("bytes moved", ui.fmt_bytes(nbytes)),
            ("achieved", ui.fmt_flops(ev["flops"] / secs) if secs > 0 else "n/a")]


def _members(data, run_id: str, ev: dict) -> list[tuple[str, str]]:
    """A fused node's members (the fuse pass), in the order its one kernel runs them: op, module path, source line."""
    if ev["op"] != "fused":
        return []
    from opscope.profiler.stats import fused_members, members_of
    run = data.run(run_id)
    members = members_of(fused_members(run), ev["node"]) if run else []
    if not members:
        return [("members", "not recorded with this run")]
    return [(f"member {i}: {m['op']}", f"{m['module'] or '(top level)'} · {m['source'] or 'unknown'}")
            for i, m in enumerate(members, 1)]


def _kernel_args(data, run_id: str, ev: dict) -> list[tuple[str, str]]:
    """An imported kernel's launch configuration (the trace's grid, block, registers, shared memory, occupancy)."""
    try:
        rows = data.store.query("SELECT grid, block, registers, shared_memory, occupancy FROM kernel_args "
                                "WHERE run_id = ? AND step = ? AND seq = ? LIMIT 1", [run_id, ev["step"], ev["seq"]])
    except Exception:            # a store from before the table, opened where it cannot be upgraded
        return []
    if not rows:
        return []
    grid, block, regs, smem, occ = rows[0]
    pairs = [("grid", _pretty(grid)), ("block", _pretty(block)),
             ("registers per thread", regs), ("shared memory", ui.fmt_bytes(smem) if smem is not None else None),
             ("est. achieved occupancy", f"{occ:g} %" if occ is not None else None)]
    return [(k, v) for k, v in pairs if v not in (None, "", "—")]


def _forward_link(data, run_id: str, ev: dict):
    """A training op's phase, and for a backward op the forward op it differentiates: "backward of NODE
    (module, source)", NODE a link that selects that op (its step's, else any step's). (element, target)."""
    rows = data.store.query("SELECT phase, fwd_node FROM events WHERE run_id = ? AND step = ? AND seq = ? LIMIT 1",
                            [run_id, ev["step"], ev["seq"]])
    phase, fwd = rows[0] if rows else (None, None)
    if phase not in ("backward", "optimizer"):      # a forward op of an inference run says nothing more
        return None, None
    if not fwd:
        return html.P(f"phase: {phase}", className="phase-line"), None
    found = data.store.query(
        """SELECT step, seq, module, source, start_ns, end_ns FROM events
           WHERE run_id = ? AND node = ? AND phase = 'forward' ORDER BY step = ? DESC, step LIMIT 1""",
        [run_id, fwd, ev["step"]])
    if not found:
        return html.P(f"backward of {fwd} (not recorded in this run)", className="phase-line"), None
    step, seq, module, source, a, b = found[0]
    run = data.run(run_id)
    shift = data.step_shifts(run).get(step, 0)
    origin = data.spans(run).t_min
    target = {"key": [step, seq, (b - a) / 1e3], "start": a - shift - origin, "end": b - shift - origin}
    where = ", ".join(x for x in (module or "(top level)", source or "source line unknown"))
    return html.P(className="phase-line", children=[
        "backward of ", html.Button(fwd, id=FORWARD, className="link-button", title=f"select {fwd}"),
        f" ({where})"]), target


def _pretty(text):
    if not text:
        return "—"
    try:
        v = json.loads(text)
    except (TypeError, ValueError):
        return str(text)
    if isinstance(v, list):
        return ", ".join(("[" + ", ".join(map(str, x)) + "]") if isinstance(x, list) else str(x) for x in v) or "—"
    return str(v)


def _fields(pairs):
    return html.Dl(className="fields", children=[x for k, v in pairs for x in (html.Dt(k), html.Dd(str(v)))])
