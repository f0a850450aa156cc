"""Operators: where the time goes, per op type or per module, and how close each op gets to the roofs."""
from __future__ import annotations

from urllib.parse import urlencode

import numpy as np
from dash import Input, Output, State, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/operators"
NAME = "Operators"

_F3, _F1 = ui.num(".3f"), ui.num(".1f")
_COLUMNS = [("key", "op"), ("count", "count", ui.NUM), ("total_ms", "total ms", _F3),
            ("self_ms", "self ms", _F3), ("mean_us", "mean us", _F1), ("p95_us", "p95 us", _F1),
            ("share", "share %", _F1), ("gflops", "achieved GFLOP/s", _F1), ("pct_peak", "% of peak", _F1),
            ("fallback", "fell back")]
_SORT = ("total_ms", "desc")
GROUPS = ("op", "module", "node")


def layout(**_query):
    return html.Div([
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("group by", className="label"),
            dcc.RadioItems(id=ids.OPS_GROUP, options=[{"label": "op type", "value": "op"},
                                                       {"label": "module", "value": "module"},
                                                       {"label": "node", "value": "node"}],
                           value="op", inline=True, className="radio")]),
                ui.table(ids.OPS_TABLE, columns("op"), [], page_size=20, select="row", sort_by=_SORT)),
        html.Div(className="grid-2", children=[
            ui.card("Roofline", dcc.Graph(id=ids.OPS_ROOFLINE, figure=theme.empty_figure("loading…"),
                                          config={"displaylogo": False})),
            ui.card("Selected", html.Div(ui.note("Click a row for the op's numbers."), id=ids.OPS_DETAIL)),
        ]),
    ])


def register(app, data):
    @app.callback(Output(ids.OPS_TABLE, "rowData"), Output(ids.OPS_TABLE, "columnDefs"),
                  Output(ids.OPS_ROOFLINE, "figure"),
                  Input(ids.RUN_STATUS, "data"), Input(ids.OPS_GROUP, "value"), Input(ids.OPS_TABLE, "cellClicked"))
    def render(status, by, cell):
        by, selected = inputs.choice(by, "group by", GROUPS) or "op", inputs.clicked_row(cell)
        run = inputs.status_run(data, status)
        if not run:
            return [], ui.column_defs(columns(by), _SORT), theme.empty_figure("No runs yet.")
        stats = data.op_table(run, by)
        rows = ui.op_swatch_rows([_row(i, s) for i, s in enumerate(stats)])
        return rows, ui.column_defs(columns(by), _SORT), roofline(run, data, stats, selected)

    # The row's numbers come from the store again, not from the table's rowData: what the browser sends is ids.
    @app.callback(Output(ids.OPS_DETAIL, "children"), Input(ids.OPS_TABLE, "cellClicked"),
                  State(ids.OPS_GROUP, "value"), State(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    def detail(cell, by, status):
        key, by = inputs.clicked_row(cell), inputs.choice(by, "group by", GROUPS) or "op"
        run = inputs.status_run(data, status)
        r = next((x for x in (_row(i, s) for i, s in enumerate(data.op_table(run, by))) if x["id"] == key),
                 None) if key and run else None
        if r is None:
            return ui.note("Click a row for the op's numbers.")
        fields = html.Dl(className="fields", children=[x for k, v in [
            ("key", r["key"]), ("op", r["op"]), ("calls", f"{r['count']:,}"), ("total", f"{r['total_ms']:.3f} ms"),
            ("self", f"{r['self_ms']:.3f} ms"), ("mean · p95", f"{r['mean_us']:.1f} us · {r['p95_us']:.1f} us"),
            ("share of run", f"{r['share']:.1f} %"), ("FLOPs", f"{r['flops']:,}"), ("bytes", ui.fmt_bytes(r["bytes"])),
            ("arithmetic intensity", f"{r['intensity']:.2f} FLOP/B" if r["intensity"] else "n/a"),
            ("achieved", ui.fmt_flops(r["gflops"] * 1e9)),
            ("% of peak", f"{r['pct_peak']:.1f} %" if r["pct_peak"] is not None else "no peak in description"),
            ("fell back", r["fallback"])] for x in (html.Dt(k), html.Dd(str(v)))])
        # Every call of this op on the timeline: its search marks them, Enter walks through them.
        href = f"/timeline?{urlencode({'run': run['run_id'], 'find': r['op']})}"
        return html.Div([fields, dcc.Link(f"Find every {r['op']} on the timeline →", href=href, id=ids.OPS_FIND,
                                          className="button")])


def columns(by):
    """The columns grouped by op type, module or node: the op type's color on the op column."""
    rest = _COLUMNS[1:]
    if by in ("module", "node"):
        return [("key", by), ("op", "op type", ui.SWATCH), *rest]
    return [("key", "op", ui.SWATCH), *rest]


def _row(i, s):
    return {"id": s["key"] or f"#{i}", "key": s["key"] or "(none)", "op": s["op"], "count": s["count"],
            "total_ms": s["total_ns"] / 1e6, "self_ms": s["self_ns"] / 1e6, "mean_us": (s["mean_ns"] or 0) / 1e3,
            "p95_us": (s["p95_ns"] or 0) / 1e3, "share": 100 * s["share"], "gflops": (s["achieved_flops"] or 0) / 1e9,
            "pct_peak": s["pct_peak"], "fallback": "yes" if s["fallback"] else "", "flops": s["flops"],
            "bytes": s["bytes"], "intensity": s["intensity"]}


def roofline(run, data, stats, selected=None) -> dict:
    """Arithmetic intensity (FLOP/byte) against achieved FLOP/s, under the description's roofs."""
    pts = [s for s in stats if s["flops"] and s["bytes"] and s["total_ns"]]
    if not pts:
        return theme.empty_figure("No op with both FLOPs and bytes: nothing to place on a roofline.")
    peak, bw = data.roofs(run)
    x = np.array([s["flops"] / s["bytes"] for s in pts])
    y = np.array([s["achieved_flops"] for s in pts])
    size = np.array([s["total_ns"] for s in pts], dtype=float)
    size = 8 + 22 * np.sqrt(size / size.max())
    traces = [dict(type="scatter", mode="markers", x=x.tolist(), y=y.tolist(), name="ops", showlegend=False,
                   text=[s["key"] for s in pts], customdata=[s["total_ns"] / 1e6 for s in pts],
                   marker=dict(size=size.tolist(), color=[theme.op_color(s["op"]) for s in pts], opacity=0.85,
                               line=dict(width=[3 if s["key"] == selected else 0.5 for s in pts], color=theme.INK)),
                   hovertemplate="<b>%{text}</b><br>%{x:.2f} FLOP/B · %{y:.3s}FLOP/s<br>%{customdata:.3f} ms"
                                 "<extra></extra>")]
    ann = []
    lo, hi = max(x.min() / 4, 1e-3), x.max() * 4
    if peak and bw:
        xs = np.geomspace(min(lo, peak / bw / 8), max(hi, peak / bw * 8), 64)
        traces.append(dict(type="scatter", mode="lines", x=xs.tolist(), y=np.minimum(peak, bw * xs).tolist(),
                           name="roof", line=dict(color=theme.INK, width=2), hoverinfo="skip"))
        ann.append(dict(x=np.log10(xs[-1]), y=np.log10(peak), text=f"compute roof {ui.fmt_flops(peak)}",
                        showarrow=False, yshift=10, xanchor="right", font=dict(size=11, color=theme.MUTED)))
        ann.append(dict(x=np.log10(xs[0]), y=np.log10(bw * xs[0]), text=f"memory roof {ui.fmt_bytes(bw)}/s",
                        showarrow=False, yshift=12, xanchor="left", font=dict(size=11, color=theme.MUTED)))
    else:
        what = "no peak in description" if not peak else "no memory bandwidth in description"
        ann.append(dict(text=f"{what}: roofs not drawn", xref="paper", yref="paper", x=0.02, y=0.98,
                        xanchor="left", showarrow=False, font=dict(size=12, color="#b45309")))
    return {"data": traces, "layout": theme.layout(
        height=380, showlegend=False, annotations=ann,
        xaxis=dict(type="log", title=dict(text="arithmetic intensity (FLOP / byte)")),
        yaxis=dict(type="log", title=dict(text="achieved FLOP/s")))}
