"""Memory: live bytes over time per backend, the peak marked and linked to the op that held it, and the ops
that allocate most. The time axis is the timeline's: ns since the run's first op, simulated gaps collapsed,
ending at the last op; so a peak at 12.3 ms here is the span at 12.3 ms there."""
from __future__ import annotations

from urllib.parse import urlencode

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, phases, theme

from . import lifetimes

PATH = "/memory"
NAME = "Memory"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)
_LINE = ["#2563eb", "#dc2626", "#059669", "#7c3aed", "#d97706"]
PEAKS = "memory-peaks"        # under the chart: each backend's peak, the op that held it, a link to it on the timeline
CATEGORIES = "memory-categories"      # a training run: bytes by category (parameter, gradient, ...) stacked over time
CAT_GRAPH = "memory-categories-graph"
CAT_PEAK = "memory-categories-peak"   # the peak's owner (the category holding most of it) and the op it follows


def layout(**_query):
    return html.Div([
        html.Div(id=CATEGORIES, style={"display": "none"}, children=ui.card(
            "Training step memory by category", dcc.Graph(id=CAT_GRAPH, figure=theme.empty_figure("loading…"),
                                                          config={"displaylogo": False}), html.Div(id=CAT_PEAK))),
        ui.card("Live bytes", dcc.Graph(id=ids.MEM_GRAPH, figure=theme.empty_figure("loading…"),
                                        config={"displaylogo": False}), html.Div(id=PEAKS)),
        ui.card("Ops that allocate most", html.Div(id="memory-table-box", children=ui.table(
            ids.MEM_TABLE, [("op", "op", ui.SWATCH), ("count", "calls", ui.NUM), ("alloc", "allocated", ui.RIGHT),
                            ("peak", "live at its peak", ui.RIGHT)], []))),
        lifetimes.card(),
    ])


def register(app, data):
    lifetimes.register(app, data)           # allocations paired with frees: a card of this page
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

    @app.callback(Output(CAT_GRAPH, "figure"), Output(CAT_PEAK, "children"), Output(CATEGORIES, "style"),
                  Input(ids.RUN_STATUS, "data"))
    def render_categories(status):
        run = inputs.status_run(data, status)
        cats = phases.memory_categories(data, run) if run else None
        if not cats:
            return theme.empty_figure(""), None, {"display": "none"}
        windows = data.step_windows(run["run_id"], run)
        axis = (min(a for _, a, _ in windows), max(b for _, _, b in windows))
        return category_figure(cats, axis), _category_peak(run, cats, axis), {}


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


def category_figure(cats: dict, axis: tuple[int, int]) -> dict:
    """Bytes by category stacked over time (torch.profiler's memory timeline), the peak marked."""
    t = ((np.asarray(cats["t"], np.float64) - axis[0]) / 1e6).tolist()
    traces = [dict(type="scatter", mode="lines", x=t, y=(np.asarray(cats[c], np.float64) / 2**20).tolist(),
                   name=c.replace("_", " "), stackgroup="one", line=dict(width=0.5, shape="hv",
                                                                          color=phases.CATEGORY_COLORS[c]),
                   hovertemplate="%{y:.2f} MiB at %{x:.3f} ms<extra>" + c.replace("_", " ") + "</extra>")
              for c in phases.CATEGORIES if any(cats[c])]
    p, ann = cats["peak"], []
    if p.get("t") is not None:
        x, y = (p["t"] - axis[0]) / 1e6, p["bytes"] / 2**20
        traces.append(dict(type="scatter", mode="markers", x=[x], y=[y], showlegend=False, name="peak",
                           marker=dict(symbol="triangle-down", size=14, color=theme.INK),
                           hovertemplate=f"peak {ui.fmt_bytes(p['bytes'])}<extra></extra>"))
        ann.append(dict(x=x, y=y, text=f"peak {ui.fmt_bytes(p['bytes'])}: mostly {_cat(p.get('owner'))}",
                        showarrow=False, yshift=16, xanchor="right", font=dict(size=12, color=theme.INK)))
    return {"data": traces, "layout": theme.layout(
        height=360, annotations=ann, hovermode="x unified", legend=dict(orientation="h", y=1.12),
        xaxis=dict(title=dict(text="time since the run's first op (ms), the timeline's axis"),
                   range=[0, (axis[1] - axis[0]) / 1e6]),
        yaxis=dict(title=dict(text="MiB"), rangemode="tozero"))}


def _cat(name) -> str:
    return str(name or "?").replace("_", " ")


def _category_peak(run, cats, axis):
    """The peak's owner (the category holding most of it), what each category held there, and its op."""
    p = cats["peak"]
    parts = ", ".join(f"{_cat(c)} {ui.fmt_bytes(p.get(c) or 0)}" for c in phases.CATEGORIES if p.get(c))
    at = f" at {ui.fmt_ns(p['t'] - axis[0])}" if p.get("t") is not None else ""
    children = [f"Peak {ui.fmt_bytes(p.get('bytes') or 0)}{at}, owner: ", html.B(_cat(p.get("owner")),
                                                                                  className="peak-owner"),
                f" ({parts}); held after ", html.B(p.get("node") or "?"),
                f" ({p.get('module') or 'top level'}, step {p['step']} · #{p.get('seq')}; every step repeats it) "]
    if p.get("op"):
        href = f"/timeline?{urlencode({'run': run['run_id'], 'step': p['step'], 'find': p['op']})}"
        children.append(dcc.Link("show it on the timeline →", href=href))
    return html.P(children, className="category-peak")
