"""SQL: a read-only query over the shown run's tables, as `opscope sql RUN "..."` runs it (Perfetto's trace
processor, for a run of opscope's).

The query runs in a child process (profiler/sql.py, query_in_child) under the same sandbox as the CLI: one
SELECT (WITH ... SELECT, EXPLAIN), no file or network access, no extension, each table this run's rows only.
The page shows at most ROWS rows and stops a query after SECONDS; anything refused is one line above the table.
"""
from __future__ import annotations

import time

from dash import Input, Output, State, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs

PATH = "/sql"
NAME = "SQL"
ROWS = 1000            # rows the page shows: a grid of more is a file to export, not a page to read
SECONDS = 10.0         # then the query is stopped (tests lower it)
EXAMPLES = {           # what a first visit shows, and the buttons that put a query in the box
    "time by op": "SELECT op, count(*) AS calls, sum(end_ns - start_ns) / 1e6 AS total_ms,\n"
                  "       avg(end_ns - start_ns) / 1e3 AS mean_us\nFROM events GROUP BY op ORDER BY total_ms DESC",
    "slowest ops": "SELECT step, seq, op, node, (end_ns - start_ns) / 1e3 AS us, input_shapes\n"
                   "FROM events ORDER BY us DESC LIMIT 20",
    "by module": "SELECT module, count(*) AS ops, sum(end_ns - start_ns) / 1e6 AS ms\n"
                 "FROM events GROUP BY module ORDER BY ms DESC",
    "Python frames": "SELECT frame, count(*) AS samples, sum(dur_ns) / 1e6 AS ms\n"
                     "FROM stacks GROUP BY frame ORDER BY ms DESC LIMIT 30",
}


def layout(**_query):
    first = next(iter(EXAMPLES.values()))
    return html.Div([
        ui.card("SQL over this run", html.P(className="muted sql-help", children=[
            "One SELECT (or WITH … SELECT, EXPLAIN) over this run's tables, each holding this run's rows only. "
            "Read-only: no files, no network, no extensions; at most ", f"{ROWS:,}", " rows shown, stopped after ",
            f"{SECONDS:g}", " s. The same as ", html.Code('opscope sql RUN "…"'), "."]),
            dcc.Textarea(id=ids.SQL_TEXT, value=first, className="sql-text", spellCheck=False,
                         placeholder="SELECT op, count(*) FROM events GROUP BY op"),
            html.Div(className="toolbar sql-bar", children=[
                html.Button("Run query", id=ids.SQL_RUN, className="button primary", n_clicks=0),
                html.Span([html.Kbd("Ctrl"), html.Kbd("Enter"), " runs it · examples:"], className="muted"),
                *[html.Button(name, className="link-button sql-example", **{"data-sql": text})
                  for name, text in EXAMPLES.items()],
            ]),
            html.Div(id=ids.SQL_TABLES, className="sql-tables")),
        ui.card(None, dcc.Loading(html.Div(id=ids.SQL_OUT, children=ui.note("Run a query to see its rows.")),
                                  type="dot", delay_show=300)),
    ])


def register(app, data):
    @app.callback(Output(ids.SQL_OUT, "children"), Input(ids.SQL_RUN, "n_clicks"), State(ids.SQL_TEXT, "value"),
                  State(ids.RUN_STATUS, "data"))
    def run_query(n, sql, status):
        run = inputs.status_run(data, status)
        sql = inputs.text(sql, "the query")
        if not run:
            return ui.note("No run to query: open a run first (the Runs page lists them).")
        if not n:
            return ui.note("Run a query to see its rows.")
        if not (sql or "").strip():
            return ui.note("Write a SELECT first.", "warn")
        return result(run["run_id"], sql, data.store.path)

    @app.callback(Output(ids.SQL_TABLES, "children"), Input(ids.RUN_STATUS, "data"))
    def tables(status):
        run = inputs.status_run(data, status)
        return table_list(data.store) if run else None


def result(run_id: str, sql: str, store_path):
    """The rows as a grid under one line (how many, how long), or the one line that refused the query."""
    from opscope.profiler.sql import query_in_child
    from opscope.runtime.errors import UsageError
    t0 = time.perf_counter()
    try:
        out = query_in_child(run_id, sql, store_path, max_rows=ROWS, seconds=SECONDS)
    except UsageError as e:
        return html.Div(str(e), className="note note-warn sql-error")
    took = time.perf_counter() - t0
    n, cols = len(out["rows"]), out["columns"]
    line = f"{n:,} row{'s' if n != 1 else ''} · {len(cols)} column{'s' if len(cols) != 1 else ''} · {took:.2f} s"
    if out["truncated_by"] == "bytes":
        line = (f"the first {n:,} rows (the answer reached {out['max_bytes'] // 1024 ** 2} MB of text: select fewer "
                f"or shorter columns, left(x, 100)) · {len(cols)} columns · {took:.2f} s")
    elif out["truncated"]:
        line = (f"the first {n:,} rows (the query gives more: add a LIMIT and OFFSET, or use "
                f"`opscope sql RUN \"…\" --max-rows N`) · {len(cols)} columns · {took:.2f} s")
    # fields by position: a column named "a.b" or "x y" would be a nested path or an odd key to the grid
    columns = [(f"c{i}", c or f"column {i + 1}", _kind([r[i] for r in out["rows"]])) for i, c in enumerate(cols)]
    rows = [{"id": str(k), **{f"c{i}": _cell(v) for i, v in enumerate(r)}} for k, r in enumerate(out["rows"])]
    return html.Div([html.Div(line, className="sql-line" + (" note note-warn" if out["truncated"] else " muted")),
                     ui.table(ids.SQL_GRID, columns, rows, page_size=50) if cols else None])


def _kind(values) -> dict:
    """Whole numbers as they are, other numbers to 6 significant digits (a mean in us reads 33690.8, not
    33690.815676470585), both right-aligned and sorted as numbers; anything else as text."""
    seen = [v for v in values if v is not None]
    if not seen or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        return {}
    return ui.NUM if all(isinstance(v, int) for v in seen) else ui.num(".6~g")


def _cell(v):
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return str(v)


def table_list(store) -> list:
    """Each table the query can read, with its columns: what to write after FROM."""
    try:
        rows = store.query("""SELECT table_name, string_agg(column_name, ', ' ORDER BY ordinal_position)
                              FROM information_schema.columns
                              WHERE table_schema = 'main' AND table_name IN (
                                  SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id')
                                AND column_name <> 'run_id'
                              GROUP BY table_name ORDER BY table_name""", [])
    except Exception:           # an empty store: nothing to list
        return []
    return [html.Span("tables: ", className="label")] + [
        html.Details(className="sql-table", children=[html.Summary(name), html.Span(cols, className="muted")])
        for name, cols in rows]
