"""Optimize: the cycles of `opscope optimize` -- per cycle the pass it tried, the gain the advice estimated next
to the gain it measured, whether it was kept, and a link to the run that cycle profiled.

app/cli/optimize.py keeps the cycles in the baseline run's config ({"optimize": {"cycles": [...], "baseline",
"final", "passes", "plan"}}); each cycle's run carries {"optimize": {"cycle": N, ...}} and names the run before
it as its parent, so any run of an optimization leads back to its baseline.
"""
from __future__ import annotations

from urllib.parse import urlencode

from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/optimize"
NAME = "Optimize"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)
MAX_HOPS = 256          # a cycle run's parents back to the baseline: far more than any --cycles


def layout(**_query):
    return html.Div([html.Div(id=ids.OPT_CHART, children=ui.note("loading…")), html.Div(id=ids.OPT_CYCLES)])


def register(app, data):
    @app.callback(Output(ids.OPT_CHART, "children"), Output(ids.OPT_CYCLES, "children"),
                  Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        base, why = _optimization(data, run)
        if base is None:
            return ui.card("Optimize", ui.note("No optimization yet: `opscope optimize MODEL -b BACKEND --cycles N` "
                                               "profiles, applies the best advice, measures and repeats.")), None
        opt = base["config"]["optimize"]
        cycles = [c for c in opt.get("cycles") or [] if isinstance(c, dict)]
        head = [ui.note(why)] if why else []
        return html.Div(head + [_chart(base, opt, cycles)]), _cycles(base, opt, cycles)


def _optimization(data, run: dict | None) -> tuple[dict | None, str]:
    """The baseline run of the optimization to show, and a line saying why it is not the open run (or "")."""
    seen = 0
    r = run
    while r is not None and seen < MAX_HOPS:
        opt = (r.get("config") or {}).get("optimize")
        if isinstance(opt, dict) and isinstance(opt.get("cycles"), list):
            return r, "" if r is run else f"Run {run['run_id']} is cycle {_cycle_of(run)} of this optimization."
        if not isinstance(opt, dict) or not r.get("parent_run"):
            break
        r, seen = data.run(r["parent_run"]), seen + 1      # a parent id is never empty: no fallback to the newest
    for r in data.runs():
        opt = (r.get("config") or {}).get("optimize")
        if isinstance(opt, dict) and isinstance(opt.get("cycles"), list):
            what = f"Run {run['run_id']} was not optimized; the newest optimization:" if run else ""
            return r, what
    return None, ""


def _cycle_of(run: dict) -> str:
    opt = (run.get("config") or {}).get("optimize")
    return str(opt.get("cycle", "?")) if isinstance(opt, dict) else "?"


def _us(seconds) -> float:
    return float(seconds or 0.0) * 1e6


def _chart(base: dict, opt: dict, cycles: list[dict]):
    b, f = opt.get("baseline") or {}, opt.get("final") or {}
    kept = ", ".join(opt.get("passes") or []) or "none"
    line = html.P(className="optimize-result", children=[
        html.Strong(f"{base.get('model')} on {base.get('backend')}"),
        f": step {_us(b.get('step_seconds')):.1f} → {_us(f.get('step_seconds')):.1f} us, "
        f"peak {ui.fmt_bytes(b.get('peak_bytes') or 0)} → {ui.fmt_bytes(f.get('peak_bytes') or 0)}; passes kept: {kept}"
        + (f"; plan {opt['plan']}" if opt.get("plan") else "")])
    if not cycles:
        return ui.card("Optimize", line, ui.note("No cycle ran: nothing the advisor or the cost model could apply "
                                                 "was expected to help."))
    x = [f"{c.get('cycle')} · {c.get('pass')}" + ("" if c.get("kept") else " (not kept)") for c in cycles]
    fig = ui.bar_figure(x, [
        {"name": "estimated gain", "color": "#93c5fd", "y": [_us(c.get("estimated_seconds")) for c in cycles],
         "hover": [f"estimated {_us(c.get('estimated_seconds')):.2f} us per step<br>from {c.get('advice')}"
                   for c in cycles]},
        {"name": "measured gain", "color": theme.STATUS["ok"], "y": [_us(c.get("measured_seconds")) for c in cycles],
         "hover": [f"measured {_us(c.get('measured_seconds')):+.2f} us per step<br>{c.get('why')}" for c in cycles]},
    ], stacked=False, y_title="gain per step (us)")
    return ui.card("Cycles: estimated vs measured gain", line,
                   dcc.Graph(id="optimize-gains", figure=fig, config={"displaylogo": False}))


def _run_link(run_id) -> html.A | str:
    if not isinstance(run_id, str) or not run_id:
        return "—"
    return dcc.Link(run_id[:12], href=f"/timeline?{urlencode({'run': run_id})}", className="cycle-run")


def _cycles(base: dict, opt: dict, cycles: list[dict]):
    b = opt.get("baseline") or {}
    head = ["cycle", "pass", "from advice", "estimated", "measured", "kept", "step", "peak", "err vs eager", "why",
            "run"]
    rows = [html.Tr([html.Td("baseline"), html.Td("—"), html.Td("—"), html.Td(""), html.Td(""), html.Td(""),
                     html.Td(f"{_us(b.get('step_seconds')):.1f} us"), html.Td(ui.fmt_bytes(b.get("peak_bytes") or 0)),
                     html.Td(f"{float(b.get('max_abs_err') or 0):.1e}"), html.Td(""),
                     html.Td(_run_link(base["run_id"]))])]
    for c in cycles:
        rows.append(html.Tr(className="cycle-kept" if c.get("kept") else "cycle-dropped", children=[
            html.Td(str(c.get("cycle"))), html.Td(str(c.get("pass"))), html.Td(str(c.get("advice") or "")),
            html.Td(f"{_us(c.get('estimated_seconds')):.2f} us"), html.Td(f"{_us(c.get('measured_seconds')):+.2f} us"),
            html.Td("yes" if c.get("kept") else "no"), html.Td(f"{_us(c.get('step_seconds')):.1f} us"),
            html.Td(ui.fmt_bytes(c.get("peak_bytes") or 0)), html.Td(f"{float(c.get('max_abs_err') or 0):.1e}"),
            html.Td(str(c.get("why") or ""), className="cycle-why"), html.Td(_run_link(c.get("run_id")))]))
    return ui.card("Per cycle", html.Table(className="plain-table", children=[
        html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(rows)]),
        html.P("Each cycle's run opens on the timeline: the profile with the passes kept so far and the one tried.",
               className="muted"))
