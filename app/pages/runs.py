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


_LONG = {"maxWidth": 260}


def layout(**_query):
    return html.Div([
        ui.card("Runs", html.P("Click a run to open it; tick two to compare them.", className="muted"),
                ui.table(ids.RUNS_TABLE, [
                    # a model path or a hybrid spec is cut at 260 px (whole on hover), not the table's last columns
                    ("run_id", "run"), ("model", "model", _LONG), ("backend", "backend", _LONG), ("engine", "engine"),
                    ("status", "status", {"cellClassRules": {"cell-failed": "params.value === 'failed'",
                                                             "cell-running": "params.value === 'running'"}}),
                    ("started", "started"), ("duration", "duration", ui.DURATION), ("steps", "steps", ui.NUM),
                    ("host", "host busy", ui.DURATION), ("device", "device busy", ui.DURATION),
                    ("events", "events", ui.NUM), ("dropped", "dropped", ui.NUM)],
                    [], select="rows", page_size=30),
                html.P("duration: the time any op ran, each moment counted once (top-level spans, host and device "
                       "together); host and device busy: the same per kind of track.", className="muted small")),
        html.Div(id=ids.RUNS_ACTIONS, className="actions"),
        html.Div(id=ids.RUNS_STEPS),
    ])


def register(app, data):
    @app.callback(Output(ids.RUNS_TABLE, "rowData"), Input(ids.RUN_STATUS, "data"))
    def rows(_status):
        out = []
        for r in data.runs():
            t = data.times(r)
            out.append({"id": r["run_id"], "run_id": r["run_id"], "model": r.get("model"), "backend": r.get("backend"),
                        "engine": r.get("engine"), "status": r.get("status"),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_at"]))
                        if r.get("started_at") else "",
                        "duration": t["busy_ns"], "steps": len(t["steps"]), "host": t["host_ns"] or None,
                        "device": t["device_ns"] or None, "events": int(r.get("events") or 0),
                        "dropped": int(r.get("dropped") or 0)})
        return out

    # Runs are looked up in the store by id: the rows the browser holds are not trusted for what they say.
    @app.callback(Output(ids.RUNS_ACTIONS, "children"), Output(ids.RUNS_STEPS, "children"),
                  Input(ids.RUNS_TABLE, "cellClicked"), Input(ids.RUNS_TABLE, "selectedRows"))
    def actions(cell, selected):
        selected = inputs.row_ids(selected, "selectedRows")       # in the order they were ticked
        rid = inputs.clicked_row(cell) or (selected[-1] if selected else None)
        if not rid:          # nothing picked yet: say what to do, or that there is nothing to pick
            if data.runs():
                return ui.note("Click a run to open its pages and see its steps; tick two to compare them."), None
            return ui.note("No runs yet. Create one with `opscope profile demo:gpt --backend sim:npu-a1`."), None
        run = data.run(rid)
        if not run:
            return ui.note(f"No run {rid!r} in this store any more.", "warn"), None
        picked = run["run_id"]
        links = [html.Span([html.B(picked), f"  {ui.run_title(run)}"], className="picked")]
        links += [dcc.Link(name, href=f"{path}?{urlencode({'run': picked})}", className="button")
                  for name, path in _PAGES]
        if len(selected) >= 2:
            a, b = selected[-2], selected[-1]
            links.append(dcc.Link(f"Compare {a[:8]} with {b[:8]}", href=f"/compare?{urlencode({'run': a, 'b': b})}",
                                  className="button primary", id="compare-link"))
        dropped = _not_imported(run)
        return links + ([dropped] if dropped else []), steps_card(data, run)


def _not_imported(run):
    """An imported trace's event kinds that no page shows, with how many of each (import.kinds_dropped)."""
    kinds = ((run.get("config") or {}).get("import") or {}).get("kinds_dropped") or {}
    if not kinds:
        return None
    listed = ", ".join(f"{k} ({int(n):,})" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return html.Div(f"Not imported from the trace: {listed}", className="muted not-imported", id="runs-not-imported")


def steps_card(data, run):
    """The run's steps: how many, the mean time of one, the slowest (a link to it on the timeline), and each."""
    from opscope.profiler.stats import step_summary
    times = data.times(run)
    summary = step_summary(times)
    if not summary["count"]:
        return ui.card("Steps", ui.note("This run recorded no events."))
    slow = summary["slowest"]
    href = f"/timeline?{urlencode({'run': run['run_id'], 'step': slow['step']})}"
    head = html.Div(className="step-summary", children=[
        html.Span([html.B(f"{summary['count']:,}"), " steps"]),
        html.Span([html.B(ui.fmt_ns(summary["mean_ns"])), " per step (mean, first op to last)"]),
        html.Span(["slowest: ", dcc.Link(f"step {slow['step']} · {ui.fmt_ns(slow['span_ns'])}", href=href,
                                         id="runs-slowest-step")])])
    rows = [{"id": str(r["step"]), "step": r["step"], "span": r["span_ns"], "busy": r["busy_ns"],
             "host": r["host_ns"] or None, "device": r["device_ns"] or None, "ops": r["ops"]} for r in times["steps"]]
    return ui.card(f"Steps of {run['run_id'][:12]}", head, ui.table("runs-steps-table", [
        ("step", "step", ui.NUM), ("span", "first op to last", ui.DURATION), ("busy", "busy", ui.DURATION),
        ("host", "host busy", ui.DURATION), ("device", "device busy", ui.DURATION), ("ops", "top-level ops", ui.NUM)],
        rows, page_size=10, row_classes={"row-bad": f"params.data.step === {slow['step']}"}))
