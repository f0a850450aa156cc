"""Runs: every run in the store; pick one to open, or two to compare."""
from __future__ import annotations

import time

from urllib.parse import urlencode

from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs

PATH = "/"
NAME = "Runs"

_PAGES = [("Timeline", "/timeline"), ("Operators", "/operators"), ("Memory", "/memory"), ("Tensors", "/tensors"),
          ("Hardware", "/hardware"), ("Advisor", "/advisor")]


def layout(**_query):
    return html.Div([
        ui.card("Runs", html.P("Click a run to open it; tick two to compare them.", className="muted"),
                ui.table(ids.RUNS_TABLE, [
                    ("run_id", "run"), ("model", "model"), ("backend", "backend"), ("engine", "engine"),
                    ("status", "status", {"cellClassRules": {"cell-failed": "params.value === 'failed'",
                                                             "cell-running": "params.value === 'running'"}}),
                    ("started", "started"), ("duration", "duration", ui.RIGHT), ("events", "events", ui.NUM),
                    ("dropped", "dropped", ui.NUM)],
                    [], select="rows", page_size=30)),
        html.Div(id=ids.RUNS_ACTIONS, className="actions"),
    ])


def register(app, data):
    @app.callback(Output(ids.RUNS_TABLE, "rowData"), Input(ids.RUN_STATUS, "data"))
    def rows(_status):
        out = []
        for r in data.runs():
            out.append({"id": r["run_id"], "run_id": r["run_id"], "model": r.get("model"), "backend": r.get("backend"),
                        "engine": r.get("engine"), "status": r.get("status"),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_at"]))
                        if r.get("started_at") else "",
                        "duration": ui.duration(r), "events": int(r.get("events") or 0),
                        "dropped": int(r.get("dropped") or 0)})
        return out

    # Runs are looked up in the store by id: the rows the browser holds are not trusted for what they say.
    @app.callback(Output(ids.RUNS_ACTIONS, "children"), Input(ids.RUNS_TABLE, "cellClicked"),
                  Input(ids.RUNS_TABLE, "selectedRows"))
    def actions(cell, selected):
        selected = inputs.row_ids(selected, "selectedRows")       # in the order they were ticked
        run = data.run(inputs.clicked_row(cell) or (selected[-1] if selected else None))
        if not run:
            return ui.note("No runs yet. Create one with `opscope profile demo:gpt --backend sim:npu-a1`.")
        picked = run["run_id"]
        links = [html.Span([html.B(picked), f"  {ui.run_title(run)}"], className="picked")]
        links += [dcc.Link(name, href=f"{path}?{urlencode({'run': picked})}", className="button")
                  for name, path in _PAGES]
        if len(selected) >= 2:
            a, b = selected[-2], selected[-1]
            links.append(dcc.Link(f"Compare {a[:8]} with {b[:8]}", href=f"/compare?{urlencode({'run': a, 'b': b})}",
                                  className="button primary", id="compare-link"))
        return links
