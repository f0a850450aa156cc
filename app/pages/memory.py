"""Memory: live bytes over time per backend, the peak marked, and the ops that allocate most."""
from __future__ import annotations

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/memory"
NAME = "Memory"
_LINE = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706"]


def layout(**_query):
    return html.Div([
        ui.card("Live bytes", dcc.Graph(id=ids.MEM_GRAPH, figure=theme.empty_figure("loading…"),
                                        config={"displaylogo": False})),
        ui.card("Ops that allocate most", html.Div(id="memory-table-box", children=ui.table(
            ids.MEM_TABLE, [("op", "op", ui.SWATCH), ("count", "calls", ui.NUM), ("alloc", "allocated", ui.RIGHT),
                            ("peak", "live at its peak", ui.RIGHT)], []))),
    ])


def register(app, data):
    @app.callback(Output(ids.MEM_GRAPH, "figure"), Output(ids.MEM_TABLE, "rowData"), Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return theme.empty_figure("No runs yet."), []
        rid = run["run_id"]
        series = data.memory_series(rid)
        top = data.top_allocators(rid)
        rows = [{"id": t["op"], "op": t["op"], "count": t["count"], "alloc": ui.fmt_bytes(t["alloc_bytes"]),
                 "peak": ui.fmt_bytes(t["peak_live"])} for t in top]
        return figure(series), ui.op_swatch_rows(rows)


def figure(series: dict) -> dict:
    if not series:
        return theme.empty_figure("This run recorded no memory samples.")
    t_min = min(min(ts) for ts, _ in series.values())
    traces, ann, peak_all = [], [], (None, -1, None)
    for i, (backend, (ts, vs)) in enumerate(sorted(series.items())):
        t = (np.asarray(ts, np.float64) - t_min) / 1e6
        v = np.asarray([x or 0 for x in vs], np.float64)
        color = _LINE[i % len(_LINE)]
        traces.append(dict(type="scattergl", mode="lines", x=t.tolist(), y=(v / 2**20).tolist(), name=backend,
                           line=dict(color=color, width=2, shape="hv"), fill="tozeroy",
                           fillcolor=color + "22", hovertemplate="%{y:.2f} MiB at %{x:.3f} ms<extra>" + backend +
                                                                "</extra>"))
        k = int(v.argmax())
        traces.append(dict(type="scatter", mode="markers", x=[t[k]], y=[v[k] / 2**20], name=f"peak {backend}",
                           marker=dict(symbol="triangle-down", size=14, color=color, line=dict(color="white", width=1)),
                           hovertemplate=f"peak {ui.fmt_bytes(v[k])}<extra>{backend}</extra>", showlegend=False))
        ann.append(dict(x=t[k], y=v[k] / 2**20, text=f"peak {ui.fmt_bytes(v[k])}", showarrow=False, yshift=16 + 16 * i,
                        font=dict(size=12, color=color)))
    return {"data": traces, "layout": theme.layout(
        height=360, annotations=ann, hovermode="closest",
        xaxis=dict(title=dict(text="time since first sample (ms)")), yaxis=dict(title=dict(text="live MiB"),
                                                                               rangemode="tozero"))}
