"""Operators: where the time goes, per op type or per module, and how close each op gets to the roofs."""
from __future__ import annotations

from urllib.parse import urlencode

import numpy as np
from dash import Input, Output, State, ctx, dcc, html, no_update

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, phases, theme
from opscope.app.web.data import bandwidth

PATH = "/operators"
NAME = "Operators"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)

_F1 = ui.num(".1f")
_COLUMNS = [("key", "op"), ("kind", "on"), ("count", "count", ui.NUM), ("total_ns", "total", ui.DURATION),
            ("self_ns", "self", ui.DURATION), ("per_step_ns", "total / step", ui.DURATION), ("total_pct", "total %", _F1), ("self_pct", "self %", _F1),
            ("mean_ns", "mean", ui.DURATION), ("p95_ns", "p95", ui.DURATION), ("gflops", "achieved FLOP/s", ui.si(1e9)),
            ("pct_peak", "% of peak", _F1), ("bytes_text", "bytes", ui.RIGHT), ("gbps", "achieved bytes/s", ui.si(1e9)),
            ("pct_bw", "% of peak BW", _F1), ("fallback", "fell back")]
_SORT = ("self_ns", "desc")
GROUPS = inputs.GROUP_BY
BUSY = "ops-busy"          # the line that says what the shares are shares of
FWD_BWD = "ops-fwd-bwd"    # a training run: forward against backward time per module (card, shown when it has them)
FWD_BWD_TABLE = "ops-fwd-bwd-table"


def layout(**_query):
    return html.Div([
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("group by", className="label"),
            dcc.RadioItems(id=ids.OPS_GROUP, options=[{"label": "name", "value": "name"},
                                                       {"label": "op type (opscope)", "value": "op"},
                                                       {"label": "module (rolled up)", "value": "module"},
                                                       {"label": "node", "value": "node"},
                                                       {"label": "phase", "value": "phase"},
                                                       {"label": "kernel category", "value": "category"}],
                           value="name", inline=True, className="radio"),
            html.Span(id=BUSY, className="muted info")]),
                ui.table(ids.OPS_TABLE, columns("name"), [], page_size=20, select="row", sort_by=_SORT)),
        html.Div(id=FWD_BWD, style={"display": "none"}, children=ui.card(
            "Forward vs backward, per module", ui.table(FWD_BWD_TABLE, [
                ("module", "module"), ("forward_ns", "forward", ui.DURATION), ("backward_ns", "backward", ui.DURATION),
                ("ratio", "backward / forward", ui.num(".2f"))], [], page_size=12, sort_by=("backward_ns", "desc")),
            html.P("A backward op counts for the module of the forward op it differentiates.", className="muted"))),
        html.Div(className="grid-2", children=[
            ui.card("Roofline", dcc.Graph(id=ids.OPS_ROOFLINE, figure=theme.empty_figure("loading…"),
                                          config={"displaylogo": False})),
            ui.card("Selected", html.Div(ui.note("Click a row for the op's numbers."), id=ids.OPS_DETAIL)),
        ]),
    ])


def register(app, data):
    # A new grouping clears the selection: the row picked under "op" names nothing under "module".
    @app.callback(Output(ids.OPS_TABLE, "rowData"), Output(ids.OPS_TABLE, "columnDefs"),
                  Output(ids.OPS_ROOFLINE, "figure"), Output(BUSY, "children"), Output(ids.OPS_TABLE, "cellClicked"),
                  Output(ids.OPS_TABLE, "selectedRows"),
                  Input(ids.RUN_STATUS, "data"), Input(ids.OPS_GROUP, "value"), Input(ids.OPS_TABLE, "cellClicked"))
    def render(status, by, cell):
        by, selected = inputs.choice(by, "group by", GROUPS) or "name", inputs.clicked_row(cell)
        regrouped = ctx.triggered_id == ids.OPS_GROUP
        if regrouped:
            selected = None
        clear = (None, []) if regrouped else (no_update, no_update)
        run = inputs.status_run(data, status)
        if not run:
            return [], ui.column_defs(columns(by), _SORT), theme.empty_figure("No runs yet."), "", *clear
        stats = _stats(data, run, by)
        rows = ui.op_swatch_rows([_row(s) for s in stats])
        if not regrouped and ctx.triggered_id == ids.OPS_TABLE:
            # a click only moves the roofline's highlight: the table is already drawn
            return no_update, no_update, roofline(run, data, stats, selected), no_update, *clear
        return rows, ui.column_defs(columns(by), None if by == "module" else _SORT), \
            roofline(run, data, stats, selected), _busy_line(data.times(run)), *clear

    # The row's numbers come from the store again, not from the table's rowData: what the browser sends is ids.
    @app.callback(Output(ids.OPS_DETAIL, "children"), Input(ids.OPS_TABLE, "cellClicked"),
                  Input(ids.OPS_GROUP, "value"), State(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    def detail(cell, by, status):
        key, by = inputs.clicked_row(cell), inputs.choice(by, "group by", GROUPS) or "name"
        run = inputs.status_run(data, status)
        if ctx.triggered_id == ids.OPS_GROUP:
            key = None
        r = next((x for x in (_row(s) for s in _stats(data, run, by)) if x["id"] == key), None) \
            if key and run else None
        if r is None:
            return ui.note("Click a row for the op's numbers.")
        pct = (lambda v: f"{v:.1f} %" if v is not None else "n/a")
        fields = html.Dl(className="fields", children=[x for k, v in [
            (by if by not in ("op", "name") else "op", r["name"]), ("op type", r["op"]), ("on", r["kind"]),
            ("calls", f"{r['count']:,}"), ("total", ui.fmt_ns(r["total_ns"])), ("self", ui.fmt_ns(r["self_ns"])),
            (f"share of {r['kind']} busy time", f"{pct(r['total_pct'])} total · {pct(r['self_pct'])} self"),
            ("mean · p95", f"{ui.fmt_ns(r['mean_ns'] or 0)} · " + (ui.fmt_ns(r["p95_ns"]) if r["p95_ns"] else "n/a")),
            ("FLOPs", f"{r['flops']:,}"), ("bytes", ui.fmt_bytes(r["bytes"])),
            ("arithmetic intensity", f"{r['intensity']:.2f} FLOP/B" if r["intensity"] else "n/a"),
            ("achieved", ui.fmt_flops(r["gflops"] * 1e9) if r["gflops"] is not None else "no FLOPs (moves bytes)"),
            ("achieved bandwidth", f"{r['gbps']:.2f} GB/s" + (f" · {r['pct_bw']:.1f} % of peak" if r["pct_bw"]
                                                                 is not None else "") if r["gbps"] else "n/a"),
            ("% of peak", f"{r['pct_peak']:.1f} %" if r["pct_peak"] is not None else "no peak in description"),
            ("fell back", r["fallback"] or "no"),
            *([("fused members", r["members"])] if r["members"] else [])] for x in (html.Dt(k), html.Dd(str(v)))])
        # Every call of this op on the timeline: its search marks them, Enter walks through them.
        find = r["key"] if by == "name" else r["op"]        # the timeline names an import's spans as the trace does
        href = f"/timeline?{urlencode({'run': run['run_id'], 'find': find})}"
        return html.Div([fields, dcc.Link(f"Find every {find} on the timeline →", href=href, id=ids.OPS_FIND,
                                          className="button")])


    @app.callback(Output(FWD_BWD_TABLE, "rowData"), Output(FWD_BWD, "style"), Input(ids.RUN_STATUS, "data"))
    def forward_backward(status):
        run = inputs.status_run(data, status)
        if not run or not phases.is_training(data, run):
            return [], {"display": "none"}
        return [{"id": r["module"], **r} for r in phases.module_phases(data, run)], {}


def _stats(data, run, by):
    """The table's rows: the store's breakdown per op, module or node; per phase, the training run's phases."""
    if by != "phase":
        return data.op_table(run, by)
    peak, bw = data.roofs(run)
    rows = phases.phase_rows(data, run)
    for r in rows:
        r["pct_peak"] = (100.0 * r["achieved_flops"] / peak) if peak and r["flops"] else None
        r["intensity"] = (r["flops"] / r["bytes"]) if r["bytes"] else None
        bandwidth(r, bw)
    return rows


def columns(by):
    """The columns grouped by op type, module or node: the op type's color on the op column; by op type or
    node, what a fused node runs (its member ops, in order)."""
    rest = _COLUMNS[1:] + ([("members", "fused members")] if by in ("name", "op", "node") else [])
    if by in ("name", "module", "node", "phase", "category"):
        return [("name", by), ("op", "op type", ui.SWATCH), *rest]
    return [("name", "op", ui.SWATCH), *rest]


def _busy_line(times) -> str:
    parts = [f"{k} busy {ui.fmt_ns(times[k + '_ns'])}" for k in ("host", "device") if times[k + "_ns"]]
    n = len(times["steps"])
    return (f"totals over {n} step{'s' if n != 1 else ''}; shares are of " + " · ".join(parts)
            + " (each moment counted once)") if parts else ""


def _row(s):
    # a module row is indented under its parent module (the table is in tree order)
    name = s["key"] or "(none)"
    if s.get("depth"):
        name = "\u2003" * s["depth"] + name.rsplit(".", 1)[-1]
    return {"id": f"{s['kind']}:{s['key']}", "key": s["key"] or "(none)", "name": name, "op": s["op"],
            "kind": s["kind"], "count": s["count"], "total_ns": s["total_ns"],
            "per_step_ns": s.get("total_ns_per_step"), "self_ns": s["self_ns"],
            "mean_ns": s["mean_ns"], "p95_ns": s["p95_ns"], "total_pct": s["total_pct"], "self_pct": s["self_pct"],
            # a transfer (a copy) moves bytes and computes nothing: GB/s, not 0 GFLOP/s
            "gflops": (s["achieved_flops"] or 0) / 1e9 if s["flops"] else None, "pct_peak": s["pct_peak"],
            "bytes_text": ui.fmt_bytes(s["bytes"]) if s["bytes"] else "",
            "gbps": s["achieved_bps"] / 1e9 if s.get("achieved_bps") else None, "pct_bw": s.get("pct_bw"),
            "fallback": "yes" if s["fallback"] else "", "flops": s["flops"], "bytes": s["bytes"],
            "intensity": s["intensity"], "members": s.get("members", "")}


def roofline(run, data, stats, selected=None) -> dict:
    """Arithmetic intensity (FLOP/byte) against achieved FLOP/s, under the description's roofs."""
    pts = [s for s in stats if s["flops"] and s["bytes"] and s["total_ns"] and not s.get("depth")]
    if not pts:
        return theme.empty_figure("No op with both FLOPs and bytes: nothing to place on a roofline.")
    peak, bw = data.roofs(run)
    x = np.array([s["flops"] / s["bytes"] for s in pts])
    y = np.array([s["achieved_flops"] for s in pts])
    size = np.array([s["total_ns"] for s in pts], dtype=float)
    size = 8 + 22 * np.sqrt(size / size.max())
    traces = [dict(type="scatter", mode="markers", x=x.tolist(), y=y.tolist(), name="ops", showlegend=False,
                   text=[s["key"] for s in pts], customdata=[ui.fmt_ns(s["total_ns"]) for s in pts],
                   marker=dict(size=size.tolist(), color=[theme.op_color(s["op"]) for s in pts], opacity=0.85,
                               line=dict(width=[3 if f"{s['kind']}:{s['key']}" == selected else 0.5 for s in pts], color=theme.INK)),
                   hovertemplate="<b>%{text}</b><br>%{x:.2f} FLOP/B · %{y:.3s}FLOP/s<br>%{customdata}"
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
        margin=dict(l=90, r=20, t=30, b=45),
        # a tick per decade, in SI prefixes with the unit on each ("10 GFLOP/s"): plotly's default "10B" reads as bytes
        xaxis=dict(type="log", dtick=1, title=dict(text="arithmetic intensity (FLOP / byte)")),
        yaxis=dict(type="log", dtick=1, tickformat="~s", ticksuffix=" FLOP/s", exponentformat="SI",
                   title=dict(text="achieved FLOP/s")))}
