"""Small building blocks every page uses: cards, notes, status pills, tables, number formats."""
from __future__ import annotations

import json
import math
import time

import dash_ag_grid as dag
from dash import html

from opscope.app.cli.common import fmt_bytes, fmt_flops

from . import theme

__all__ = ["fmt_bytes", "fmt_flops", "fmt_ns", "card", "note", "status_pill", "run_badge", "alert_banner", "run_title",
           "duration", "bar_figure",
           "table", "column_defs", "header_min_width", "op_swatch_rows", "NUM", "RIGHT", "SWATCH", "DURATION", "num", "si"]


def clock_caption(clocks: dict) -> str:
    """What a run's times measure, per kind of track (Data.clocks): "host: wall clock · device: simulated clock"."""
    return " · ".join(f"{kind}: {clock} clock" for kind, clock in sorted(clocks.items(), reverse=True))


def fmt_ns(ns) -> str:
    """A duration in the unit that suits it, three significant digits (56.2 ms, 820 us, 4.00 s): what the
    tables and the timeline write (assets/formats.js `duration`, which timeline.js calls too), so a span's panel and
    its table row read the same. The unit is chosen after rounding: 999.96 us reads 1.00 ms."""
    v = float(ns)
    a = abs(float(f"{v:.3g}"))
    if a >= 1e12:                       # 1000 s and more: whole seconds, never an exponent
        return f"{v / 1e9:.0f} s"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if a >= scale:
            text = f"{v / scale:#.3g}"
            return f"{text.rstrip('.')} {unit}"
    return f"{math.floor(v + 0.5)} ns"


def card(title, *children, className="card", **kw):
    head = html.H3(title, className="card-title") if title else None
    return html.Section([c for c in (head, *children) if c is not None], className=className, **kw)


def note(text, kind="info"):
    """A one-line message in place of a chart: what is missing and how to get it."""
    return html.Div(text, className=f"note note-{kind}")


def status_pill(status: str | None):
    status = status or "?"
    return html.Span(status, className=f"pill pill-{status}")


def run_title(run: dict) -> str:
    return f"{run.get('model')} on {run.get('backend')}"


def duration(run: dict) -> str:
    if not run.get("started_at"):
        return ""
    end = run.get("ended_at") or time.time()
    return f"{end - run['started_at']:.1f} s"


def run_badge(run: dict, arrived: int):
    """The header's summary of the shown run: id, model/backend, status, events arrived / dropped."""
    parts = [html.Code(run["run_id"][:12], className="run-id"), html.Span(run_title(run), className="run-title", title=run_title(run)),
             status_pill(run.get("status")),
             html.Span(f"{arrived:,} events", className="count", id="events-arrived")]
    if run.get("dropped"):        # "0 dropped" on every page cost the bar its room at 1280 px; a loss is shown
        parts.append(html.Span(f"{int(run['dropped']):,} dropped", className="count warn", id="events-dropped"))
    if run.get("status") == "failed" and run.get("error"):
        parts.append(html.Span(str(run["error"]).splitlines()[0][:160], className="run-error", title=str(run["error"])))
    return parts


SEVERITY_ORDER = ("critical", "warning", "info")     # profiler/alerts/rules.py's severities, worst first


def most_severe(alerts: list[dict]) -> dict | None:
    """The alert a banner shows: the worst severity, the latest of those."""
    def rank(a):
        sev = a.get("severity")
        return (SEVERITY_ORDER.index(sev) if sev in SEVERITY_ORDER else len(SEVERITY_ORDER),
                -float(a.get("time") or 0) if isinstance(a.get("time"), (int, float)) else 0)
    return min(alerts, key=rank) if alerts else None


def alert_banner(alerts: list[dict], where: str = ""):
    """The header's banner for a run's alerts (`opscope monitor --run` stores them in the run's config): the most
    severe with its message, and how many more there are (all of them in the tooltip). None when there are none."""
    alerts = [a for a in alerts if isinstance(a, dict)]
    worst = most_severe(alerts)
    if worst is None:
        return None
    sev = str(worst.get("severity") or "warning")
    more = len(alerts) - 1
    every = "\n".join(f"{a.get('severity')} {a.get('rule')}: {a.get('message')}" for a in alerts[-50:])
    return html.Div(className=f"alert alert-{sev}", title=every, children=[
        html.Span(sev, className=f"pill pill-{sev}"),
        html.Strong(str(worst.get("rule") or "alert"), className="alert-rule"),
        html.Span(str(worst.get("message") or ""), className="alert-message"),
        html.Span(where, className="muted") if where else None,
        html.Span(f"+{more} more alert{'s' if more > 1 else ''}", className="muted") if more else None])


# The grid's look, from the theme's constants: the page font, a quiet header, compact 30 px rows, no
# wrapper border (a card already frames it). Row tints and status colors are classes in opscope.css.
_GRID_THEME = {"function": "themeQuartz.withParams(" + json.dumps({
    "fontFamily": theme.FONT, "fontSize": 13, "foregroundColor": theme.INK, "accentColor": theme.ACCENT,
    "headerFontSize": 12, "headerFontWeight": 600, "headerTextColor": theme.MUTED, "headerBackgroundColor": "#f5f7fa",
    "headerHeight": 32, "rowHeight": 30, "cellHorizontalPadding": 10, "borderColor": "#e3e7ec",
    "rowBorder": {"color": "#eef1f4"}, "wrapperBorder": False, "wrapperBorderRadius": 0,
    "rowHoverColor": "#f3f6fa", "selectedRowBackgroundColor": "#e8f0fe", "headerColumnResizeHandleColor": "#dfe4ea"})
    + ")"}

# Columns as wide as the values they show (headers wrap above them: header_min_width), widened to fill the card
# when there is room (a narrower card scrolls sideways under the pinned first column, its scrollbar drawn always:
# opscope.css): AG Grid does it for the first rows; these listeners redo it for new rows (a live run, another
# grouping) and when the card changes width.
_FIT = {"type": "fitCellContents", "scaleUpToFitGridWidth": True}
_REFIT = ["params.api.autoSizeAllColumns({scaleUpToFitGridWidth: true})"]
_REFIT_ON = {"rowDataUpdated": _REFIT, "gridSizeChanged": _REFIT}

# Column kinds for table()'s third column element: numbers right-aligned (and formatted in the browser with
# d3-format, so they still sort as numbers), text left.
NUM = {"type": "numericColumn"}
RIGHT = {"type": "rightAligned"}      # numbers the server already formatted with their unit ("1.5 MiB")
# A duration in ns, shown in the unit that suits each value (56.2 ms, 812 us: assets/formats.js), sorted as a number.
DURATION = {"type": "numericColumn", "valueFormatter": {"function": "duration(params.value)"}}
# A ratio B/A with the digits it needs (1.23x, 0.0042x: assets/formats.js, as fmt_ratio), sorted as a number.
RATIO = {"type": "numericColumn", "valueFormatter": {"function": "ratio(params.value)"}}


def si(scale: float = 1.0) -> dict:
    """A rate with an SI prefix (11.4 T, 19.1 G: assets/formats.js `si`), the header naming the unit; scale turns the
    stored value into units (1e9 for a value stored in GFLOP/s). Sorted as a number."""
    return {"type": "numericColumn", "valueFormatter": {"function": f"si(params.value, {scale!r})"}}


def num(d3_format: str) -> dict:
    """A number column shown with d3-format: ".3f" fixed, ".2e" exponent, ".4g" significant digits."""
    return {"type": "numericColumn", "valueFormatter": {
        "function": f"params.value == null ? '' : d3.format('{d3_format}')(params.value)"}}


# The op column's left edge in its op's color (the rows carry it: op_swatch_rows), the timeline's colors.
SWATCH = {"cellStyle": {"function": "params.data && params.data.swatch ? "
                                    "{boxShadow: 'inset 4px 0 0 ' + params.data.swatch} : null"}}


def table(id, columns, rows, *, sort=True, page_size=25, select=None, row_classes=None, sort_by=None):
    """An AG Grid in the house style, as tall as its rows (paged past page_size).

    columns: (field, header) or (field, header, column options: NUM, num(...), RIGHT, SWATCH, or AG Grid's own).
    rows: dicts with a unique "id" (the row id callbacks get in cellClicked["rowId"]).
    select: "row" highlights the row clicked; "rows" adds checkboxes to pick several (selectedRows).
    row_classes: AG Grid rowClassRules, {css class: JS condition on params.data}; the colors live in opscope.css.
    sort_by: (field, "asc" | "desc"), the order before the user clicks a header.
    """
    options = {"theme": _GRID_THEME, "domLayout": "autoHeight", "pagination": True, "paginationPageSize": page_size,
               "paginationPageSizeSelector": False, "autoSizeStrategy": _FIT, "skipHeaderOnAutoSize": True,
               "enableBrowserTooltips": True}
    if select == "rows":
        options["rowSelection"] = {"mode": "multiRow", "checkboxes": True, "headerCheckbox": False,
                                   "enableClickSelection": False}
        options["selectionColumnDef"] = {"pinned": "left"}    # the tick boxes stay beside the pinned first column
    elif select == "row":
        options["rowSelection"] = {"mode": "singleRow", "checkboxes": False, "enableClickSelection": True}
    return dag.AgGrid(
        id=id, columnDefs=column_defs(columns, sort_by), rowData=rows, getRowId="params.data.id",
        defaultColDef={"sortable": sort, "resizable": True, "suppressMovable": True, "cellDataType": False,
                       "minWidth": 60, "wrapHeaderText": True, "autoHeaderHeight": True},
        rowClassRules=row_classes or {}, dashGridOptions=options, eventListeners=_REFIT_ON, className="grid",
        style={"width": "100%"})


def header_min_width(header: str) -> int:
    """The narrowest a column may get: its header's longest word on one line, with the cell padding and the sort
    arrow. Columns are sized to their values alone (skipHeaderOnAutoSize) and headers wrap, so a long header
    ("communication under compute") over short values ("0%") takes three lines instead of 200 px of the card."""
    longest = max((len(w) for w in str(header).split()), default=0)
    return max(60, round(longest * 7.4) + 2 * 10 + 18)


def column_defs(columns, sort_by=None) -> list[dict]:
    """table()'s column list as AG Grid columnDefs (a callback that changes the columns sends these)."""
    defs = []
    for c in columns:
        extra = c[2] if len(c) > 2 else {}
        d = {"field": c[0], "headerName": c[1], "minWidth": header_min_width(c[1]), **extra}
        if "type" not in extra:
            d["tooltipField"] = c[0]      # a text cut short (a narrow card) shows itself whole on hover
        if not defs:
            d["pinned"] = "left"          # a table wider than its card scrolls under its first column, never it
        if sort_by and sort_by[0] == c[0]:
            d["initialSort"] = sort_by[1]      # initial: a later columnDefs update keeps the user's sort
        defs.append(d)
    return defs


def op_swatch_rows(rows: list[dict]) -> list[dict]:
    """Give each row its op's color (the timeline's), for the SWATCH column."""
    for r in rows:
        r["swatch"] = theme.op_color(r["op"]) if r.get("op") else None
    return rows


def bar_figure(labels: list[str], series: list[dict], *, stacked: bool, y_title: str, height: int = 340) -> dict:
    """Bars, stacked or side by side, as a plotly figure drawn with filled scatter polygons.

    NOTE: the pages load a partial plotly.js (assets/vendor/README.md) that has no bar trace; a filled polygon
    per bar is the same picture, and an invisible marker at each bar's middle carries its hover text.
    series: [{name, color, y: one value per label, hover: one text per label (optional)}].
    """
    n, width = len(labels), 0.7
    traces, base = [], [0.0] * n
    for k, s in enumerate(series):
        xs, ys, mx, my = [], [], [], []
        for i, v in enumerate(s["y"]):
            v = float(v or 0.0)
            if stacked:
                x0, x1, y0, y1 = i - width / 2, i + width / 2, base[i], base[i] + v
                base[i] = y1
            else:
                w = width / max(len(series), 1)
                x0 = i - width / 2 + k * w
                x1, y0, y1 = x0 + w * 0.92, 0.0, v
            xs += [x0, x0, x1, x1, x0, None]
            ys += [y0, y1, y1, y0, y0, None]
            mx.append((x0 + x1) / 2)
            my.append((y0 + y1) / 2)
        traces.append(dict(type="scatter", mode="lines", name=s["name"], x=xs, y=ys, fill="toself",
                           fillcolor=s["color"], line=dict(width=0.5, color="white"), hoverinfo="skip",
                           legendgroup=s["name"]))
        traces.append(dict(type="scatter", mode="markers", x=mx, y=my, showlegend=False, legendgroup=s["name"],
                           marker=dict(size=16, opacity=0, color=s["color"]), name=s["name"],
                           customdata=s.get("hover") or [f"{s['name']}: {float(v or 0):.4g}" for v in s["y"]],
                           hovertemplate="%{customdata}<extra></extra>"))
    layout = theme.layout(height=height, margin=dict(l=60, r=10, t=10, b=70), hovermode="closest",
                          xaxis=dict(tickvals=list(range(n)), ticktext=labels, range=[-0.6, n - 0.4], showgrid=False,
                                     zeroline=False),
                          yaxis=dict(title=dict(text=y_title), zeroline=True, rangemode="tozero" if stacked else "normal"))
    return {"data": traces, "layout": layout}
