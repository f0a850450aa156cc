"""Compare: two runs side by side (the same model on two backends, before/after advice), op by op in
time and, where both recorded tensor values (--values), in value."""
from __future__ import annotations

import math

import numpy as np
from dash import Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from opscope.app.cli.common import fmt_ratio
from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme
from opscope.app.web.data import page_data
from opscope.profiler.compare import compare_runs, side_is_kept, warnings

PATH = "/compare"
NAME = "Compare"
_F3, _F2, _E = ui.num(".3f"), ui.num(".4~g"), ui.num(".2e")
TOLERANCE = 1e-3     # relative difference of a summary statistic that counts as a numerical divergence


def layout(run=None, b=None, **_query):
    run, b = inputs.query(run, "run"), inputs.query(b, "b")
    data = page_data()
    # The two runs are picked here, in the page's own answer, so the table's callback starts at once instead of
    # after the header's run lookup and a callback that picks them (two round trips in series on a first visit).
    # NOTE: the dropdown drops a value missing from its options; with no data (Dash validating the layout) each
    # id from the URL comes with a placeholder option.
    # Two finished runs whose numbers are kept (kept.py) are read in well under a second: the page comes with them
    # drawn, and the table's callback is not asked (one round trip less, behind the header's callbacks). Both
    # read in one open of the store (content(kept_only=True) writes nothing).
    opts, drawn = [], None
    if data:
        with data.store.connect(read_only=True):
            opts, run, b = pick(data, run, b)
            drawn = content(data, run, b, kept_only=True) if run and b else None
    summary, chart, rows, errors = drawn or (None, ui.note("loading…"), [], None)
    return html.Div([
        dcc.Store(id=ids.CMP_SHOWN, data=[run, b] if drawn else None),
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("run A", className="label"),
            dcc.Dropdown(id=ids.CMP_A, value=run, options=opts or ([run] if run else []), clearable=False,
                         className="dropdown"),
            html.Label("run B", className="label"),
            dcc.Dropdown(id=ids.CMP_B, value=b, options=opts or ([b] if b else []), clearable=False,
                         className="dropdown")]),
                html.Div(id=ids.CMP_SUMMARY, className="summary", children=summary)),
        html.Div(className="grid-2", children=[
            ui.card("Time per op: B / A", html.Div(id=ids.CMP_GRAPH, children=chart)),
            ui.card("Per op, per step", ui.table(ids.CMP_TABLE, [
                ("op", "op", ui.SWATCH), ("a_ms", "A ms / step", _F3), ("b_ms", "B ms / step", _F3),
                ("ratio", "B / A", ui.RATIO), ("a_count", "A calls / step", _F2), ("b_count", "B calls / step", _F2)],
                rows, page_size=15)),
        ]),
        ui.card("Numerical error per op (tensor summaries recorded in both runs)", html.Div(id=ids.CMP_ERROR,
                                                                                           children=errors)),
    ])


def register(app, data):
    # The list of runs again when the shown run's status changes (a live run ends, a new run is stored).
    @app.callback(Output(ids.CMP_A, "options"), Output(ids.CMP_B, "options"), Input(ids.RUN_STATUS, "data"),
                  prevent_initial_call=True)
    def choices(_status):
        opts = _options(data.runs())
        return opts, opts

    # The address bar follows the picked runs (a link copied from it opens this comparison), without a reload.
    app.clientside_callback("""function (a, b) {
      if (!a || !b) return window.dash_clientside.no_update;
      var q = new URLSearchParams(location.search);
      q.set("run", a); q.set("b", b);
      history.replaceState(history.state, "", location.pathname + "?" + q.toString());
      return window.dash_clientside.no_update;
    }""", Output(ids.CMP_A, "className"), Input(ids.CMP_A, "value"), Input(ids.CMP_B, "value"))

    @app.callback(Output(ids.CMP_SUMMARY, "children"), Output(ids.CMP_GRAPH, "children"),
                  Output(ids.CMP_TABLE, "rowData"), Output(ids.CMP_ERROR, "children"), Input(ids.CMP_A, "value"),
                  Input(ids.CMP_B, "value"), State(ids.CMP_SHOWN, "data"))
    def render(a, b, shown):
        a, b = inputs.text(a, "run A"), inputs.text(b, "run B")
        if ctx.triggered_id is None and inputs.run_pair(shown, "runs shown") == [a, b]:
            raise PreventUpdate             # the first call, for the two runs the page came with
        return content(data, a, b)


def content(data, a, b, kept_only: bool = False):
    """(summary, chart, table rows, numerical errors) of runs a and b. kept_only: None unless both runs' numbers
    are kept (then every read shares one open of the store, and nothing is computed or written)."""
    # NOTE: reads inside one open of the store share it: each read opened the store file anew (20 ms, more on a
    # loaded machine, and each holds the process's store lock). compare_runs joins it only when it reads kept
    # numbers: it may keep a side's answer, a write (not inside a reader's open).
    doc = None
    with data.store.connect(read_only=True):
        ra, rb = data.run(a) if a else None, data.run(b) if b else None
        if kept_only and not (ra and rb and side_is_kept(data.store, ra) and side_is_kept(data.store, rb)):
            return None
        errors = _errors(data, ra, rb) if ra and rb else ""
        if kept_only:
            doc = compare_runs(data.store, ra, rb)
    if not ra or not rb:
        return ui.note("Compare needs two runs: profile the model on two backends."), ui.note("pick two runs"), [], ""
    # the CLI's numbers (profiler.compare): every op per step, the totals per step counted once
    doc = doc or compare_runs(data.store, ra, rb)
    rows = [{"id": o["op"], "op": o["op"], "op_type": o["op_type"], "a_ms": o["a_ns"] / 1e6,
             "b_ms": o["b_ns"] / 1e6, "ratio": o["ratio"], "a_count": o["a_count"], "b_count": o["b_count"]}
            for o in doc["ops"]]
    ta, tb = doc["totals"]["a"], doc["totals"]["b"]
    total_a, total_b = ta["busy_ns"], tb["busy_ns"]
    summary = html.Div([html.Div(className="compare-heads", children=[
        _head("A", ra, ta), _head("B", rb, tb),
        html.Div(className="ratio", children=[html.Span("B / A per step", className="muted"),
                                              html.B(fmt_ratio(total_b / total_a) if total_a and total_b else "n/a")])]),
        *[ui.note(w, "warn") for w in warnings(ta, tb)]])
    return summary, _ratio_chart(rows), ui.op_swatch_rows(rows), errors


def pick(data, a, b) -> tuple[list[dict], str | None, str | None]:
    """The dropdowns' options and the two runs shown: those asked for (a prefix of an id is enough), else the
    newest two runs of one model (a model on two backends, before/after advice), else the two newest with events."""
    a, b = inputs.text(a, "run A"), inputs.text(b, "run B")
    with data.store.connect(read_only=True):       # one open of the store for the three reads
        runs = data.runs()
        a = _resolve(data, a) if a else None
        b = _resolve(data, b) if b else None
    known = {r["run_id"] for r in runs}
    useful = [r for r in runs if r.get("events")] or runs
    if a not in known and b not in known:
        pair = next(((y, x) for i, x in enumerate(useful) for y in useful[i + 1:] if y["model"] == x["model"]),
                    None) or ((useful[1], useful[0]) if len(useful) > 1 else (useful[0], useful[0]) if useful
                              else ({"run_id": None}, {"run_id": None}))
        a, b = pair[0]["run_id"], pair[1]["run_id"]
    elif a not in known:
        a = _partner(runs, useful, b)
    elif b not in known:
        b = _partner(runs, useful, a)
    return _options(runs), a, b


def _partner(runs, useful, rid) -> str:
    """The run to compare `rid` with: the newest other run of its model, else the newest other run, else itself."""
    model = next((r["model"] for r in runs if r["run_id"] == rid), None)
    same = [r for r in useful if r["run_id"] != rid and r["model"] == model]
    return (same or [r for r in useful if r["run_id"] != rid] or [{"run_id": rid}])[0]["run_id"]


def _options(runs) -> list[dict]:
    return [{"label": f"{r['run_id'][:8]} · {ui.run_title(r)} · {r['status']}", "value": r["run_id"]} for r in runs]


def _resolve(data, rid):
    run = data.run(rid)
    return run["run_id"] if run else None


def _head(label, run, t):
    split = " · ".join(f"{k} {ui.fmt_ns(t[k + '_ns'])}" for k in ("host", "device") if t[k + "_ns"])
    clock = html.Span("simulated clock", className="pill pill-sim") if t["simulated"] else None
    return html.Div(className="compare-head", children=[
        html.Span(label, className="tag"), html.Code(run["run_id"][:12]), html.Span(ui.run_title(run)),
        ui.status_pill(run.get("status")), clock, html.B(ui.fmt_ns(t["busy_ns"]), title="busy time per step"),
        html.Span(f"per step · {split}", className="muted")])


def _ratio_chart(rows):
    """A lollipop per op (the 25 that take longest) from 1 (same time) to B / A on a log axis, drawn in HTML:
    a plotly figure needs plotly.js, a 1.6 MB script whose parse (0.4-2.7 s, one long task) came before the
    page's first request (server._EARLY: this page is not one of the PLOTS pages, so plotly.js is not loaded)."""
    rows = [r for r in rows if r["ratio"]][:25]
    if not rows:
        return ui.note("No op ran in both runs.")
    lo = math.floor(math.log10(min(1.0, *(r["ratio"] for r in rows))))
    hi = math.ceil(math.log10(max(1.0, *(r["ratio"] for r in rows))))
    lo, hi = (lo - 1, hi + 1) if lo == hi else (lo, hi)

    def at(x):                     # percent of the track's width
        return 100 * (math.log10(x) - lo) / (hi - lo)

    def pct(v):
        return f"{v:.3f}%"
    lines = []
    for r in rows:
        x = r["ratio"]
        left, right = sorted((at(1.0), at(x)))
        lines.append(html.Div(className="ratio-row", title=f"{r['op']}: B takes {fmt_ratio(x)} A's time", children=[
            html.Span(r["op"], className="ratio-op"),
            html.Div(className="ratio-track", children=[
                html.I(className="ratio-one", style={"left": pct(at(1.0))}),
                html.I(className="ratio-stem", style={"left": pct(left), "width": pct(right - left)}),
                html.I(className="ratio-dot", style={"left": pct(at(x)), "background": theme.op_color(r["op"])})]),
            html.Span(fmt_ratio(x), className="ratio-value")]))
    ticks = [html.Span(f"{10.0 ** k:g}x", className="ratio-tick", style={"left": pct(at(10.0 ** k))})
             for k in range(lo, hi + 1)]
    return html.Div(className="ratio-chart", children=[
        *lines, html.Div(className="ratio-row ratio-axis", children=[
            html.Span("", className="ratio-op"), html.Div(ticks, className="ratio-track"),
            html.Span("", className="ratio-value")]),
        html.Div("B time / A time (log)", className="ratio-caption muted")])


def _errors(data, ra, rb):
    ta, tb = data.tensor_rows(ra["run_id"]), data.tensor_rows(rb["run_id"])
    if not ta or not tb:
        missing = " and ".join(x for x, t in (("A", ta), ("B", tb)) if not t)
        return ui.note(f"No tensor values in run {missing}: profile both with --values to diff them op by op.")
    # Nodes keep their names across backends; seq does not (fallback transfers shift it).
    key = (lambda t: (t["step"], t["node"], t["slot"]))
    ib = {key(t): t for t in tb if t["node"]}
    rows, first = [], None
    for t in ta:
        o = ib.get(key(t))
        if o is None or not t["slot"].startswith("out"):
            continue
        scale = max(abs(t["max"] or 0), abs(t["min"] or 0), 1e-12)
        err = max(_d(t["mean"], o["mean"]), _d(t["std"], o["std"]), _d(t["min"], o["min"]), _d(t["max"], o["max"]))
        rel = err / scale
        rows.append({"id": f"{t['step']}/{t['node']}/{t['slot']}", "node": t["node"], "op": t["op"],
                     "slot": t["slot"], "step": t["step"], "abs": err, "rel": rel,
                     "nan": f"{t['nan'] or 0} / {o['nan'] or 0}"})
        if first is None and (rel > TOLERANCE or (t["nan"] or 0) != (o["nan"] or 0)):
            first = rows[-1]
    if not rows:
        return ui.note("The two runs share no recorded op outputs (different models?).")
    head = (ui.note(f"First op past {TOLERANCE:g} relative difference: {first['node']} ({first['op']}), "
                    f"step {first['step']}, rel {first['rel']:.2e}", "warn") if first else
            ui.note(f"Every shared op output agrees within {TOLERANCE:g} (relative, on min/max/mean/std).", "ok"))
    return html.Div([head, ui.table("compare-error-table", [
        ("node", "node"), ("op", "op"), ("slot", "slot"), ("step", "step", ui.NUM),
        ("abs", "max |Δ stat|", _E), ("rel", "relative", _E), ("nan", "NaN A / B", ui.RIGHT)], rows, page_size=12,
        row_classes={"row-bad": f"params.data.rel > {TOLERANCE!r}"})])


def _d(x, y):
    if x is None or y is None:
        return 0.0
    if not (math.isfinite(x) and math.isfinite(y)):
        return 0.0 if (x == y or (np.isnan(x) and np.isnan(y))) else float("inf")
    return abs(x - y)
