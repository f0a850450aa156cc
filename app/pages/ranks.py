"""Ranks: a multi-rank run per rank and step -- compute, communication, idle, their overlap, and the slow rank
(opscope.profiler.ranks, HTA's temporal breakdown)."""
from __future__ import annotations

from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs
from opscope.profiler.ranks import Ranks

PATH = "/ranks"
NAME = "Ranks"

# The stacked parts of a rank's step window; they add up to the window (first op's start to last op's end).
PARTS = [("compute only", "#2563eb"), ("compute + communication", "#7c3aed"), ("communication only", "#f59e0b"),
         ("idle", "#cbd5e1")]


def layout(**_query):
    return html.Div([html.Div(id=ids.RANKS_SUMMARY, children=ui.note("loading…")),
                     html.Div(id=ids.RANKS_GRAPH)])


def register(app, data):
    @app.callback(Output(ids.RANKS_SUMMARY, "children"), Output(ids.RANKS_GRAPH, "children"),
                  Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return ui.note("No runs yet."), None
        world = int(((run.get("config") or {}).get("dist") or {}).get("world_size") or 0)
        analysis = Ranks.of_run(data.store, run["run_id"])
        rows = [r for r in analysis.temporal_breakdown() if r["rank"] >= 0]
        if len({r["rank"] for r in rows}) < 2:
            return ui.card("Ranks", ui.note(
                "This run has one rank. Profile several: `opscope train MODEL --hybrid torch:cpu=0.5,numpy=0.5` "
                "(one process per share) or run under torchrun.")), None
        backends = _rank_backends(run)
        return _summary(analysis, backends, world), _breakdown(rows, backends)


def _rank_backends(run: dict) -> dict[int, str]:
    listed = ((run.get("config") or {}).get("dist") or {}).get("backends") or []
    return {i: str(b) for i, b in enumerate(listed)}


def _rank_name(rank: int, backends: dict[int, str]) -> str:
    return f"rank {rank} ({backends[rank]})" if rank in backends else f"rank {rank}"


def _summary(analysis: Ranks, backends: dict[int, str], world: int):
    summary = analysis.summary()
    slow_steps = analysis.slow_rank()
    overlap = {o["rank"]: o for o in analysis.overlap()}
    slowest = summary["slowest_rank"]
    times_slow = sum(1 for s in slow_steps if s["slow_rank"] == slowest)
    lags = [float(s.get("lag_s") or 0.0) for s in slow_steps if s["slow_rank"] == slowest]
    head = html.P(id="ranks-slowest", className="ranks-slowest", children=[
        "Slowest rank: ", html.Strong(_rank_name(slowest, backends)),
        f" — the rank the others waited for in {times_slow} of {len(slow_steps)} steps (up to "
        f"{ui.fmt_ns(max(lags) * 1e9)} in a collective); it waits least in communication."]) \
        if slowest is not None else None
    table_rows = []
    for r in summary["ranks"]:
        o = overlap.get(r["rank"], {})
        table_rows.append({"id": str(r["rank"]), "rank": _rank_name(r["rank"], backends), "steps": r["steps"],
                           "compute": r["compute_s"] * 1e9, "communication": r["communication_s"] * 1e9,
                           "idle": r["idle_s"] * 1e9, "overlap": o.get("overlap_ratio", 0.0),
                           "slow": sum(1 for s in slow_steps if s["slow_rank"] == r["rank"])})
    per_rank = ui.table("ranks-table", [
        ("rank", "rank"), ("steps", "steps", ui.NUM), ("compute", "compute", ui.DURATION),
        ("communication", "communication", ui.DURATION), ("idle", "idle", ui.DURATION),
        ("overlap", "communication under compute", ui.num(".0%")), ("slow", "steps as the slow rank", ui.NUM)],
        table_rows, row_classes={"row-slow": f"params.data.id === '{slowest}'"})
    steps = ui.table("ranks-steps", [
        ("step", "step", ui.NUM), ("rank", "slow rank"), ("compute", "its compute", ui.DURATION),
        ("median", "median rank's compute", ui.DURATION), ("wait", "its wait in collectives", ui.DURATION),
        ("lag", "the others waited up to", ui.DURATION)],
        [{"id": str(s["step"]), "step": s["step"], "rank": _rank_name(s["slow_rank"], backends),
          "compute": s["compute_s"] * 1e9, "median": s.get("median_compute_s", 0.0) * 1e9,
          "wait": float(s.get("wait_s") or 0.0) * 1e9, "lag": float(s.get("lag_s") or 0.0) * 1e9}
         for s in slow_steps], page_size=10)
    size = world or summary["world_size"]
    return html.Div([
        ui.card(f"Ranks · world size {size}", head, per_rank,
                html.P("Communication: collectives (all_reduce, all_gather, ...); compute: every other op; idle: "
                       "the rest of a rank's step window (first op's start to last op's end). A collective ends when "
                       "its last rank arrives: the slow rank is the one that waits least in it.", className="muted")),
        ui.card("Slow rank per step", steps)])


def _breakdown(rows: list[dict], backends: dict[int, str]):
    """Stacked bars, one per rank and step (steps in order, the ranks of a step side by side)."""
    rows = sorted(rows, key=lambda r: (r["step"], r["rank"]))
    labels = [f"rank {r['rank']}<br>step {r['step']}" for r in rows]
    parts = {
        "compute only": [r["compute_s"] - r["overlap_s"] for r in rows],
        "compute + communication": [r["overlap_s"] for r in rows],
        "communication only": [r["exposed_communication_s"] for r in rows],
        "idle": [r["idle_s"] for r in rows]}
    hover = [f"{_rank_name(r['rank'], backends)}, step {r['step']}<br>window {ui.fmt_ns(r['window_s'] * 1e9)}"
             f"<br>compute {ui.fmt_ns(r['compute_s'] * 1e9)} · communication {ui.fmt_ns(r['communication_s'] * 1e9)}"
             f"<br>overlap {ui.fmt_ns(r['overlap_s'] * 1e9)} · idle {ui.fmt_ns(r['idle_s'] * 1e9)}" for r in rows]
    fig = ui.bar_figure(labels, [{"name": name, "color": color, "y": [v * 1e3 for v in parts[name]],
                                  "hover": [f"<b>{name}</b> {v * 1e3:.3f} ms<br>{h}" for v, h in zip(parts[name], hover)]}
                                 for name, color in PARTS], stacked=True, y_title="ms", height=360)
    return ui.card("Per rank and step: compute, communication, idle",
                   dcc.Graph(id="ranks-breakdown", figure=fig, config={"displaylogo": False}))
