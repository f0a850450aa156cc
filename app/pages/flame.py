"""Flame graph: the run's Python stacks, or its op nesting, as an icicle (the root on top, callees below),
each bar as wide as its total time; hover for total and self time, click to zoom into a frame.

The tree comes from profiler/flame.py (spans merged by their path of names); assets/flame.js draws it on a
canvas, so a tree of 20,000 frames draws as fast as one of 20.
"""
from __future__ import annotations

from dash import Input, Output, dcc, html, no_update

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs
from opscope.app.web.data import page_data

PATH = "/flame"
NAME = "Flame"            # the top bar's twelve links and the run's counts fit 1280 px
KINDS = [{"label": "Python stacks", "value": "stacks"}, {"label": "op nesting", "value": "ops"}]

_DRAW_JS = """function (tree) {
  if (window.opscopeFlame) window.opscopeFlame.draw(tree);
  return window.dash_clientside.no_update;
}"""


def layout(run=None, **_query):
    run = inputs.query(run, "run")
    data = page_data()
    shown = data.run(run) if data else None
    kind = "stacks" if shown and _has_stacks(data, shown["run_id"]) else "ops"
    return html.Div([
        ui.card(None, html.Div(className="toolbar", children=[
            html.Label("show", className="label"),
            dcc.RadioItems(id=ids.FLAME_KIND, options=KINDS, value=kind, inline=True, className="radio"),
            html.Label("step", className="label"),
            dcc.Dropdown(id=ids.FLAME_STEP, options=[{"label": "all steps", "value": "all"}], value="all",
                         clearable=False, className="dropdown small"),
            html.Span("click a frame to zoom into it · click the top bar or double-click to zoom out · "
                      "width: total time · self time in the tooltip and the table", className="hint"),
        ]), html.Div(id=ids.FLAME_GRAPH, className="flame-canvas", children=ui.note("loading…")),
                dcc.Store(id=ids.FLAME_DATA)),
        ui.card("Heaviest by self time", html.Div(id=ids.FLAME_TABLE)),
    ])


def _has_stacks(data, run_id: str) -> bool:
    return bool(data.store.query("SELECT 1 FROM stacks WHERE run_id = ? LIMIT 1", [run_id]))


def register(app, data):
    @app.callback(Output(ids.FLAME_STEP, "options"), Input(ids.RUN_STATUS, "data"))
    def steps(status):
        run = inputs.status_run(data, status)
        if not run:
            return no_update
        return [{"label": "all steps", "value": "all"}] + [
            {"label": f"step {s}", "value": s} for s, _, _ in data.step_windows(run["run_id"], run)]

    @app.callback(Output(ids.FLAME_DATA, "data"), Output(ids.FLAME_TABLE, "children"),
                  Input(ids.RUN_STATUS, "data"), Input(ids.FLAME_KIND, "value"), Input(ids.FLAME_STEP, "value"))
    def render(status, kind, step):
        run = inputs.status_run(data, status)
        kind = inputs.choice(kind, "what to show", ("stacks", "ops")) or "ops"
        step = inputs.step(step)
        if not run:
            return {"message": "No runs yet: `opscope profile MODEL` records one."}, None
        step = None if step in (None, "all") else step
        tree = tree_of(data, run, kind, step)
        if not tree["name"] or tree["root_total"] <= 0:
            return {"message": _empty(kind)}, ui.note(_empty(kind))
        # Python frames are timed on the host's wall clock; ops on their tracks' clocks (a sim run's: simulated)
        clock = "wall clock" if kind == "stacks" else ui.clock_caption(data.clocks(run))
        return {**tree, "kind": kind, "run": run["run_id"]}, heaviest_table(tree, kind, clock)

    app.clientside_callback(_DRAW_JS, Output(ids.FLAME_DATA, "id"), Input(ids.FLAME_DATA, "data"))


def tree_of(data, run: dict, kind: str, step) -> dict:
    from opscope.profiler.flame import flame_tree
    key = ("flame", run["run_id"], int(run.get("events") or 0), run.get("status"), kind, step)
    return data._memoized(key, lambda: flame_tree(data.store, run["run_id"], kind, step))


def _empty(kind: str) -> str:
    if kind == "stacks":
        return ("This run has no Python stacks: profile with --py-spy, or import a torch.profiler trace recorded "
                "with with_stack=True. \"op nesting\" shows its ops.")
    return "This run recorded no ops."


def heaviest_table(tree: dict, kind: str, clock: str = ""):
    from opscope.profiler.flame import heaviest
    root = tree["root_total"] or 1.0
    what = "frame" if kind == "stacks" else "op"
    rows = [{"id": r["name"], "name": r["name"], "self": r["self"], "self_pct": 100.0 * r["self"] / root,
             "total": r["total"], "total_pct": min(100.0, 100.0 * r["total"] / root), "calls": r["calls"]}
            for r in heaviest(tree)]
    how = ("Each op sits under the module path that ran it (a graph's ops do not nest in time); a module's time "
           "is its ops'. " if tree.get("by_module") else "")
    left_out = tree.get("left_out", 0)
    if left_out > 0:        # a tree too big to send whole: its narrowest frames' self time is in no row
        how += f"The {left_out:,} narrowest of its {tree['nodes']:,} {what}s are left out. "
    return html.Div([
        html.P(f"{how}Self time: in the {what} itself, not in what it calls (the self times add up to the whole"
               f"{', less what is left out' if left_out > 0 else ''}). "
               f"Total: with its callees, counted once where it recurses. Shares are of the whole "
               f"({ui.fmt_ns(root)}){f'; times on the {clock}' if clock else ''}.", className="muted"),
        ui.table(ids.FLAME_TABLE + "-grid", [("name", what, {"maxWidth": 620}), ("self", "self time", ui.DURATION),
                                             ("self_pct", "self %", ui.num(".1f")),
                                             ("total", "total time", ui.DURATION),
                                             ("total_pct", "total %", ui.num(".1f")), ("calls", "calls", ui.NUM)],
                 rows, sort_by=("self", "desc"))])
