"""Small building blocks every page uses: cards, notes, status pills, tables, number formats."""
from __future__ import annotations

import time

from dash import dash_table, html

from opscope.app.cli.common import fmt_bytes, fmt_flops, fmt_ns

from . import theme

__all__ = ["fmt_bytes", "fmt_flops", "fmt_ns", "card", "note", "status_pill", "run_badge", "table", "run_title"]


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
    parts = [html.Code(run["run_id"][:12], className="run-id"), html.Span(run_title(run), className="run-title"),
             status_pill(run.get("status")),
             html.Span(f"{arrived:,} events", className="count", id="events-arrived"),
             html.Span(f"{int(run.get('dropped') or 0):,} dropped",
                       className="count warn" if run.get("dropped") else "count", id="events-dropped")]
    if run.get("status") == "failed" and run.get("error"):
        parts.append(html.Span(str(run["error"]).splitlines()[0][:160], className="run-error", title=str(run["error"])))
    return parts


def table(id, columns, rows, *, sort=True, page_size=25, style_rows=None, selectable=None, **kw):
    """A DataTable in the house style. columns: (id, name) or (id, name, type/format dict)."""
    cols = []
    for c in columns:
        d = {"id": c[0], "name": c[1]}
        if len(c) > 2:
            d.update(c[2])
        cols.append(d)
    return dash_table.DataTable(
        id=id, columns=cols, data=rows, sort_action="native" if sort else "none", page_size=page_size,
        row_selectable=selectable, cell_selectable=True,
        style_as_list_view=True,
        style_table={"overflowX": "auto"},
        style_header={"fontWeight": "600", "backgroundColor": "#f5f7fa", "color": theme.INK,
                      "borderBottom": "1px solid #d9dee5", "fontFamily": theme.FONT, "fontSize": "12px"},
        style_cell={"fontFamily": theme.FONT, "fontSize": "13px", "padding": "6px 10px", "color": theme.INK,
                    "border": "none", "borderBottom": "1px solid #eef1f4", "textAlign": "right",
                    "maxWidth": "360px", "overflow": "hidden", "textOverflow": "ellipsis"},
        style_cell_conditional=[{"if": {"column_id": c[0]}, "textAlign": "left"} for c in columns
                                if c[0] in ("key", "op", "node", "model", "backend", "run_id", "status", "module",
                                            "slot", "engine", "started", "shape", "dtype", "what")],
        style_data_conditional=(style_rows or []) + [
            {"if": {"state": "active"}, "backgroundColor": "#e8f0fe", "border": "none"},
            {"if": {"state": "selected"}, "backgroundColor": "#e8f0fe", "border": "none"}],
        **kw)


def op_swatch_rows(ops, column="op") -> list[dict]:
    """Color the op column by op type, the same colors as the timeline."""
    return [{"if": {"filter_query": f'{{op}} = "{op}"', "column_id": column},
             "borderLeft": f"4px solid {theme.op_color(op)}"} for op in sorted(set(ops))]
