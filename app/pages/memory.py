"""Memory: live bytes over time per backend, the peak marked and linked to the op that held it, and the ops
that allocate most. The time axis is the timeline's: ns since the run's first op, simulated gaps collapsed,
ending at the last op; so a peak at 12.3 ms here is the span at 12.3 ms there."""
from __future__ import annotations

from urllib.parse import urlencode

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/memory"
NAME = "Memory"
_LINE = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706"]
PEAKS = "memory-peaks"        # under the chart: each backend's peak, the op that held it, a link to it on the timeline


def layout(**_query):
    return html.Div([
        ui.card("Live bytes", dcc.Graph(id=ids.MEM_GRAPH, figure=theme.empty_figure("loading…"),
                                        config={"displaylogo": False}), html.Div(id=PEAKS)),
        ui.card("Ops that allocate most", html.Div(id="memory-table-box", children=ui.table(
            ids.MEM_TABLE, [("op", "op", ui.SWATCH), ("count", "calls", ui.NUM), ("alloc", "allocated", ui.RIGHT),
                            ("peak", "live at its peak", ui.RIGHT)], []))),
    ])


def register(app, data):
    @app.callback(Output(ids.MEM_GRAPH, "figure"), Output(ids.MEM_TABLE, "rowData"), Output(PEAKS, "children"),
                  Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return theme.empty_figure("No runs yet."), [], None
        rid = run["run_id"]
        windows = data.step_windows(rid, run)
        axis = (min(a for _, a, _ in windows), max(b for _, _, b in windows)) if windows else None
        shifts = data.step_shifts(run)
        series = {}
        for b, (ts, vs, st) in data.memory_series(rid, with_steps=True).items():
            # on the timeline's axis (simulated gaps collapsed), in time order again
            pts = sorted(zip((t - shifts.get(s, 0) for t, s in zip(ts, st)), vs))
            series[b] = ([t for t, _ in pts], [v for _, v in pts])
        top = data.top_allocators(rid)
        rows = [{"id": t["op"], "op": t["op"], "count": t["count"], "alloc": ui.fmt_bytes(t["alloc_bytes"]),
                 "peak": ui.fmt_bytes(t["peak_live"])} for t in top]
        peaks = data.memory_peaks(run) if series else []
        return figure(series, axis), ui.op_swatch_rows(rows), _peak_links(run, peaks, axis)


def _peak_links(run, peaks, axis):
    """Each backend's peak, named by the op that held it, with a link to that step on the timeline."""
    items = []
    for p in peaks:
        if not p["op"]:
            continue
        at = f" at {ui.fmt_ns(p['t'] - axis[0])}" if axis else ""
        href = f"/timeline?{urlencode({'run': run['run_id'], 'step': p['step'], 'find': p['op']})}"
        items.append(html.Div(className="peak-link", children=[
            html.Span(className="swatch", style={"background": theme.op_color(p["op"])}),
            f"Peak on {p['backend']}: {ui.fmt_bytes(p['bytes'])}{at}, held after ", html.B(p["op"]),
            f" ({p['node']}, step {p['step']} · #{p['seq']}) ",
            dcc.Link("show it on the timeline →", href=href, className="memory-peak-op")]))
    return items or None


def figure(series: dict, axis: tuple[int, int] | None = None) -> dict:
    """axis: (first op's start, last op's end) in ns: the chart spans exactly the timeline's run."""
    if not series:
        return theme.empty_figure("This run recorded no memory samples.")
    t_min = axis[0] if axis else min(min(ts) for ts, _ in series.values())
    traces, ann = [], []
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
        xaxis=dict(title=dict(text="time since the run's first op (ms), the timeline's axis"),
                   **({"range": [0, (axis[1] - axis[0]) / 1e6]} if axis else {})),
        yaxis=dict(title=dict(text="live MiB"), rangemode="tozero"))}
