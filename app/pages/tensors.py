"""Tensors: for runs recorded with --values, each op output's statistics over the steps, its histogram,
and the first op that produced a NaN or an Inf."""
from __future__ import annotations

import json

from dash import Input, Output, State, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/tensors"
NAME = "Tensors"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)
_G = ui.num(".4g")


def layout(**_query):
    return html.Div([
        html.Div(id=ids.TEN_FIRST_BAD),
        ui.card("Op outputs (latest step)", ui.table(ids.TEN_TABLE, [
            ("node", "node"), ("op", "op", ui.SWATCH), ("slot", "slot"), ("shape", "shape"), ("dtype", "dtype"),
            ("steps", "steps", ui.NUM), ("min", "min", _G), ("max", "max", _G), ("mean", "mean", _G),
            ("std", "std", _G), ("nan", "NaN", ui.NUM), ("inf", "Inf", ui.NUM)], [], page_size=15, select="row",
            row_classes={"row-bad": "params.data.nan > 0 || params.data.inf > 0"})),
        html.Div(className="grid-2", children=[
            ui.card("Over the steps", dcc.Graph(id=ids.TEN_STATS, figure=theme.empty_figure("Click a row."),
                                                config={"displaylogo": False})),
            ui.card("Histogram", dcc.Graph(id=ids.TEN_HIST, figure=theme.empty_figure("Click a row."),
                                           config={"displaylogo": False})),
        ]),
    ])


def register(app, data):
    @app.callback(Output(ids.TEN_TABLE, "rowData"), Output(ids.TEN_FIRST_BAD, "children"),
                  Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return [], ui.note("No runs yet.")
        rows = data.tensor_rows(run["run_id"])
        if not rows:
            return [], ui.note("This run recorded no tensor values: profile it with --values to see each op's "
                               "output statistics.")
        latest, steps = {}, {}
        for r in rows:
            k = _key(r)
            latest[k] = r
            steps[k] = steps.get(k, 0) + 1
        table = [{"id": k, "node": r["node"], "op": r["op"], "slot": r["slot"], "shape": _shape(r["shape"]),
                  "dtype": r["dtype"], "steps": steps[k], "min": r["min"], "max": r["max"], "mean": r["mean"],
                  "std": r["std"], "nan": r["nan"] or 0, "inf": r["inf"] or 0} for k, r in latest.items()]
        bad = next((r for r in rows if (r["nan"] or 0) or (r["inf"] or 0)), None)
        head = (ui.note(f"First NaN/Inf: {bad['node']} ({bad['op']}) {bad['slot']} at step {bad['step']}: "
                        f"{bad['nan'] or 0} NaN, {bad['inf'] or 0} Inf", "warn") if bad else
                ui.note(f"No NaN or Inf in {len(rows):,} recorded tensors.", "ok"))
        return ui.op_swatch_rows(table), head

    @app.callback(Output(ids.TEN_STATS, "figure"), Output(ids.TEN_HIST, "figure"),
                  Input(ids.TEN_TABLE, "cellClicked"), State(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    def select(cell, status):
        key, run = inputs.clicked_row(cell), inputs.status_run(data, status)
        if not key or not run:
            return theme.empty_figure("Click a row."), theme.empty_figure("Click a row.")
        rows = [r for r in data.tensor_rows(run["run_id"]) if _key(r) == key]
        if not rows:
            return theme.empty_figure("Click a row."), theme.empty_figure("Click a row.")
        steps = [r["step"] for r in rows]
        colors = {"min": "#64748b", "max": "#0f172a", "mean": "#2563eb", "std": "#d97706"}
        stats = {"data": [dict(type="scatter", mode="lines+markers", x=steps, y=[r[s] for r in rows], name=s,
                               line=dict(color=c, width=2)) for s, c in colors.items()],
                 "layout": theme.layout(height=300, xaxis=dict(title=dict(text=f"step ({rows[-1]['node']} "
                                                                           f"{rows[-1]['slot']})"), dtick=1))}
        return stats, _hist(rows[-1])


def _key(r) -> str:
    """A table row's id: one op output (node, or seq for an unnamed one, and slot) across the steps."""
    return f"{r['node'] or r['seq']}/{r['slot']}"


def _hist(r):
    try:
        counts = json.loads(r["hist"]) if r["hist"] else []
    except ValueError:
        counts = []
    if not counts or r["hist_lo"] is None or r["hist_hi"] is None:
        return theme.empty_figure("No histogram recorded for this tensor.")
    lo, hi, n = float(r["hist_lo"]), float(r["hist_hi"]), len(counts)
    w = (hi - lo) / n if n else 1.0
    # A filled step outline over the bin edges: the served plotly.js bundle has no bar trace (assets/vendor/README.md).
    return {"data": [dict(type="scatter", mode="lines", x=[lo + i * w for i in range(n + 1)], y=list(counts) + counts[-1:],
                          line=dict(shape="hv", color=theme.op_color(r["op"] or "")), fill="tozeroy",
                          hovertemplate="from %{x:.4g}: %{y}<extra></extra>")],
            "layout": theme.layout(height=300, xaxis=dict(title=dict(text=f"value at step {r['step']}")),
                                   yaxis=dict(title=dict(text="count")))}


def _shape(s):
    try:
        return "×".join(map(str, json.loads(s))) if s else ""
    except (TypeError, ValueError):
        return str(s)
