"""Timeline: one track per backend/device/thread (and Python stacks when py-spy ran).

Zoom with the mouse or W/S, pan with A/D (assets/opscope.js); every zoom asks the server for the
window's level of detail, so the browser never holds more than a few thousand spans per track.
"""
from __future__ import annotations

import json

from dash import Input, Output, Patch, State, ctx, dcc, html, no_update

from opscope.app.web import components as ui
from opscope.app.web import ids, theme
from opscope.app.web import timeline as lod

PATH = "/timeline"
NAME = "Timeline"
WINDOW = "timeline-window"     # dcc.Store: the zoom window in ns, or None for the whole run
ZOOM = "timeline-zoom"         # dcc.Store: the x range the user zoomed to (ms), or "auto"
DRAWN = "timeline-drawn"       # dcc.Store: which run state the figure shows ("id:events:status")
PICKED = "timeline-picked"     # dcc.Store: the clicked vertex's customdata [key0, key1, us]

# Only real x-range changes reach the server: a resize or the first autosize also fires relayoutData,
# and would otherwise cancel an in-flight render of the zoom that came just before it.
_ZOOM_JS = """function (r) {
  var skip = window.dash_clientside.no_update;
  if (!r) return skip;
  if (r['xaxis.autorange']) return 'auto';
  var a = r['xaxis.range[0]'], b = r['xaxis.range[1]'];
  if (r['xaxis.range']) { a = r['xaxis.range'][0]; b = r['xaxis.range'][1]; }
  if (a === undefined || b === undefined) return skip;
  return [a, b];
}"""

# The figure ships typed arrays (timeline.typed), which clickData does not carry back; the decoded
# customdata row lives in the plot's _fullData, so the browser picks it there.
_PICK_JS = """function (click) {
  var skip = window.dash_clientside.no_update;
  if (!click || !click.points || !click.points.length) return skip;
  var p = click.points[0], gd = document.querySelector('#timeline-graph .js-plotly-plot');
  var tr = gd && gd._fullData && gd._fullData[p.curveNumber];
  var row = tr && tr.customdata && tr.customdata[p.pointNumber];
  return row ? Array.prototype.slice.call(row) : skip;
}"""

_GRAPH_CONFIG = {"displaylogo": False, "scrollZoom": True,
                 "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"]}


def layout(run=None, step=None, **_query):
    """The page with its first figure already drawn: no callback round trip before the first paint.

    ?step=N opens on one step (the dropdown's choice, as a link)."""
    data = _data()
    shown = data.run(run) if data else None
    windows = data.step_windows(shown["run_id"]) if data and shown else []
    window = next(([a, b] for s, a, b in windows if str(s) == str(step)), None)
    fig, info, drawn = (theme.empty_figure("loading…"), "", None) if data is None else _draw(data, shown, window)
    steps = [{"label": "all steps", "value": "all"}] + [{"label": f"step {s}", "value": s} for s, _, _ in windows]
    return html.Div([
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("step", className="label"),
            dcc.Dropdown(id=ids.TL_STEP, options=steps, value=int(step) if window else "all", clearable=False,
                         className="dropdown small"),
            html.Span(info, id=ids.TL_INFO, className="muted info"),
            html.Span([html.Kbd("W"), html.Kbd("S"), " zoom  ", html.Kbd("A"), html.Kbd("D"), " pan  ",
                       " · click a span for details"], className="hint"),
        ]), dcc.Graph(id=ids.TL_GRAPH, figure=fig, className="timeline-graph", config=_GRAPH_CONFIG),
                dcc.Store(id=WINDOW, data=window), dcc.Store(id=ZOOM), dcc.Store(id=DRAWN, data=drawn), dcc.Store(id=PICKED)),
        ui.card("Span", html.Div(ui.note("Click a span to see its op, shapes, dtypes, FLOPs, module and source."),
                                 id=ids.TL_DETAILS)),
    ])


def _data():
    """The app's WebData, found through the Flask app serving this request (several apps may share a process)."""
    try:
        from flask import current_app
        return getattr(current_app, "opscope_data", None)
    except RuntimeError:          # no request: Dash validating the layout
        return None


def _stamp(data, run) -> str:
    return f"{run['run_id']}:{data.arrived(run)}:{run.get('status')}"


def _step_options(data, run):
    return [{"label": "all steps", "value": "all"}] + [
        {"label": f"step {s}", "value": s} for s, _, _ in data.step_windows(run["run_id"])]


def _draw(data, run, window):
    """(figure, info line, drawn stamp) for a run and a window in ns (None: the whole run)."""
    if run is None:
        return theme.empty_figure("No runs yet: `opscope profile MODEL` records one."), "", None
    stamp = _stamp(data, run)
    spans = data.spans(run)
    if spans.count == 0:
        msg = {"running": "The run has started; its first ops have not arrived yet.",
               "failed": f"The run failed before its first op: {run.get('error') or ''}"}.get(
            run.get("status"), "This run recorded no events.")
        return theme.empty_figure(msg), "", stamp
    t0, t1 = window if window else (spans.t_min, spans.t_max + max(1, (spans.t_max - spans.t_min) // 100))
    view = lod.level_of_detail(spans, t0, t1)
    info = (f"{view.visible:,} of {spans.count:,} spans in view · {len(view.shown):,} drawn"
            + (f" · {len(view.b_track):,} pixel buckets" if len(view.b_track) else ""))
    return lod.figure(spans, view), info, stamp


def register(app, data):
    @app.callback(Output(ids.TL_STEP, "options"), Input(ids.RUN_STATUS, "data"), State(DRAWN, "data"),
                  prevent_initial_call=True)
    def steps(status, drawn):
        if not status or drawn == f"{status['run']}:{status['events']}:{status['status']}":
            return no_update              # the layout listed this state's steps already
        return _step_options(data, data.run(status["run"]))

    app.clientside_callback(_ZOOM_JS, Output(ZOOM, "data"), Input(ids.TL_GRAPH, "relayoutData"))
    app.clientside_callback(_PICK_JS, Output(PICKED, "data"), Input(ids.TL_GRAPH, "clickData"),
                            prevent_initial_call=True)

    @app.callback(Output(ids.TL_GRAPH, "figure"), Output(ids.TL_INFO, "children"), Output(WINDOW, "data"),
                  Output(DRAWN, "data"),
                  Input(ids.RUN_STATUS, "data"), Input(ZOOM, "data"), Input(ids.TL_STEP, "value"),
                  State(WINDOW, "data"), State(DRAWN, "data"), prevent_initial_call=True)
    def render(status, zoom, step, window, drawn):
        if not status:
            return theme.empty_figure("No runs yet: `opscope profile MODEL` records one."), "", None, None
        run = data.run(status["run"])
        trigger = ctx.triggered_id
        if trigger == ids.RUN_STATUS and run is not None and drawn == _stamp(data, run):
            return no_update, no_update, no_update, no_update      # the layout drew this state already
        spans = data.spans(run) if run is not None else None
        if trigger == ids.TL_STEP:
            window = None
            if step not in (None, "all"):
                window = next(([a, b] for s, a, b in data.step_windows(run["run_id"]) if s == step), None)
        elif trigger == ZOOM and zoom and spans is not None and spans.count:
            w = lod.window_from_relayout({"xaxis.range": zoom} if isinstance(zoom, list) else
                                         {"xaxis.autorange": True}, spans)
            window = list(w) if w else None
        fig, info, stamp = _draw(data, run, window)
        if trigger == ZOOM and stamp == drawn and fig.get("data"):
            # A zoom changes the spans, not the axes or the tracks: send only the traces and the range.
            patch = Patch()
            patch["data"] = fig["data"]
            patch["layout"]["xaxis"]["range"] = fig["layout"]["xaxis"]["range"]
            fig = patch
        return fig, info, window, stamp

    @app.callback(Output(ids.TL_DETAILS, "children"), Input(PICKED, "data"), State(ids.RUN_STATUS, "data"),
                  prevent_initial_call=True)
    def details(cd, status):
        if not cd or not status or len(cd) < 3:
            return no_update
        key0, key1 = int(cd[0]), int(cd[1])
        if key0 == -1:
            return ui.note(f"{key1:,} spans shorter than a pixel at this zoom ({cd[2]:.1f} us busy): zoom in "
                           "(W or drag) to see them one by one.")
        run = data.run(status["run"])
        if key0 == lod.STACK_KEY:
            f = data.stack_frame(run, key1)
            return _fields([("Python frame", f["frame"]), ("depth", f["depth"]), ("thread", f["thread"]),
                            ("duration", ui.fmt_ns(f["dur_ns"]))]) if f else no_update
        ev = data.event(run["run_id"], key0, key1)
        if ev is None:
            return ui.note("That event is no longer in the store.", "warn")
        dur = max(1, ev["end_ns"] - ev["start_ns"])
        return html.Div(className="span-details", children=[
            html.H4([html.Span(className="swatch", style={"background": theme.op_color(ev["op"])}), ev["op"],
                     html.Span(f"  {ui.fmt_ns(dur)}", className="muted")]),
            _fields([
                ("node", ev["node"]), ("module path", ev["module"] or "(top level)"),
                ("source line", ev["source"] or "unknown"),
                ("backend", f"{ev['backend']} · {ev['device'] or ''} · thread {ev['thread']}"),
                ("step · seq", f"{ev['step']} · {ev['seq']}"),
                ("input shapes", _pretty(ev["input_shapes"])), ("input dtypes", _pretty(ev["input_dtypes"])),
                ("output shapes", _pretty(ev["output_shapes"])), ("output dtypes", _pretty(ev["output_dtypes"])),
                ("FLOPs", f"{int(ev['flops'] or 0):,}"), ("bytes moved", ui.fmt_bytes(ev["bytes"] or 0)),
                ("achieved", ui.fmt_flops((ev["flops"] or 0) / (dur / 1e9))),
                ("fell back", "yes: the backend has no kernel for it" if ev["fallback"] else "no"),
                ("live bytes after", ui.fmt_bytes(ev["live_bytes"]) if ev["live_bytes"] is not None else "n/a"),
            ])])


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
