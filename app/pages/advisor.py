"""Advisor: what to change for a run, ranked by estimated gain (opscope.profiler.advisor)."""
from __future__ import annotations

from dash import Input, Output, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs
from opscope.profiler.advisor import advise

PATH = "/advisor"
NAME = "Advisor"


def layout(**_query):
    return html.Div(id=ids.ADV_LIST, children=ui.note("loading…"))


def register(app, data):
    @app.callback(Output(ids.ADV_LIST, "children"), Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return ui.note("No runs yet.")
        items = advise(run["run_id"], store=data.store)
        if not items:
            return ui.card("Advice", ui.note("No advice for this run: nothing the rules recognize.", "ok"))
        return html.Div([_advice(a) for a in items])


def _advice(a):
    gain = getattr(a, "estimated_gain", None)
    ev = getattr(a, "evidence", None) or {}
    return ui.card(a.title, html.Div(className="advice", children=[
        html.Div([ui.status_pill(getattr(a, "severity", "info")),
                  html.Span(_gain(gain), className="muted")], className="advice-head"),
        html.P(a.message),
        html.Dl(className="fields", children=[x for k, v in list(ev.items())[:8]
                                               for x in (html.Dt(str(k).replace("_", " ")),
                                                         html.Dd(_value(v, str(k))))]) if ev else None,
        html.Code(getattr(a, "id", ""), className="muted")]), className="card advice-card")


def _gain(g) -> str:
    if isinstance(g, dict) and ("fraction" in g or "seconds" in g):
        parts = [f"{g['fraction']:.0%} of the step" if g.get("fraction") is not None else "",
                 ui.fmt_ns(g["seconds"] * 1e9) if g.get("seconds") is not None else ""]
        return "estimated gain " + " · ".join(p for p in parts if p)
    if isinstance(g, float):
        return f"estimated gain {g:.0%}" if g < 1.5 else f"estimated gain {g:.3g}"
    return f"estimated gain {g}" if g else ""


def _value(v, key: str = "") -> str:
    """Evidence in the units its name says (seconds, bytes), lists and records without Python reprs."""
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "—"}[v]
    if isinstance(v, (int, float)) and key.endswith("seconds"):
        return ui.fmt_ns(v * 1e9)
    if isinstance(v, int) and key.endswith("bytes"):
        return ui.fmt_bytes(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return " · ".join(f"{k.replace('_', ' ')} {_value(x, k)}" for k, x in v.items() if x not in (None, [], ""))
    if isinstance(v, (list, tuple)):
        items = [_value(x, key) for x in v[:6]]
        return "; ".join(items) + (f"; … ({len(v)} in all)" if len(v) > 6 else "")
    text = str(v)
    return text if len(text) < 200 else text[:200] + "…"

