"""Ranks: a multi-rank run per rank and step -- compute, communication, idle, their overlap, and the slow rank
(opscope.profiler.ranks, HTA's temporal breakdown)."""
from __future__ import annotations

from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs
from opscope.profiler.ranks import Ranks

PATH = "/ranks"
NAME = "Ranks"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)

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
        return _summary(analysis, backends, world, (run.get("config") or {}).get("dist")), _breakdown(rows, backends)


def _rank_backends(run: dict) -> dict[int, str]:
    listed = ((run.get("config") or {}).get("dist") or {}).get("backends") or []
    return {i: str(b) for i, b in enumerate(listed)}


def _rank_name(rank: int, backends: dict[int, str]) -> str:
    return f"rank {rank} ({backends[rank]})" if rank in backends else f"rank {rank}"


_CLOCKS = {
    "wall": "Clock: wall — every span measured on its host's monotonic clock (the ranks of one host share it).",
    "simulated": "Clock: simulated — a described chip's compute spans last its simulated time while collectives "
                 "are measured on the host, so waiting says nothing about which chip is slower: the slow rank is the "
                 "one with the most compute."}


def _bytes(n) -> str:
    if not n:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _optimizer_state(report: dict) -> dict[int, int]:
    """Optimizer-state bytes per rank from a hybrid run's last step (--shard optimizer divides them)."""
    steps = report.get("steps") if isinstance(report, dict) else None
    last = steps[-1] if isinstance(steps, list) and steps and isinstance(steps[-1], dict) else {}
    state = last.get("optimizer_state_bytes") if isinstance(last.get("optimizer_state_bytes"), dict) else {}
    return {int(k): int(v) for k, v in state.items() if str(k).isdigit() and isinstance(v, (int, float))}


def _summary(analysis: Ranks, backends: dict[int, str], world: int, run_report: dict | None = None):
    summary = analysis.summary()
    slow_steps = analysis.slow_rank()
    overlap = {o["rank"]: o for o in analysis.overlap()}
    slowest = summary["slowest_rank"]
    times_slow = sum(1 for s in slow_steps if s["slow_rank"] == slowest)
    waited = {r["rank"]: r.get("others_waited_s", 0.0) for r in summary["ranks"]}
    why = ("the others waited for it {} in all, the most of any rank; it was the slow rank in {} of {} steps."
           if analysis.clock == "wall" else
           "the most compute on the simulated clock ({} of waiting behind it); the slow rank in {} of {} steps.")
    head = html.P(id="ranks-slowest", className="ranks-slowest", children=[
        "Slowest rank: ", html.Strong(_rank_name(slowest, backends)), " — " +
        why.format(ui.fmt_ns(waited.get(slowest, 0.0) * 1e9), times_slow, len(slow_steps))]) \
        if slowest is not None else None
    memory = {m["rank"]: m["peak_live_bytes"] for m in analysis.memory()}
    state = _optimizer_state(run_report)
    table_rows = []
    for r in summary["ranks"]:
        o = overlap.get(r["rank"], {})
        table_rows.append({"id": str(r["rank"]), "rank": _rank_name(r["rank"], backends), "steps": r["steps"],
                           "compute": r["compute_s"] * 1e9, "communication": r["communication_s"] * 1e9,
                           "idle": r["idle_s"] * 1e9, "overlap": o.get("overlap_ratio", 0.0),
                           "slow": sum(1 for s in slow_steps if s["slow_rank"] == r["rank"]),
                           "waited": waited.get(r["rank"], 0.0) * 1e9,
                           "memory": _bytes(memory.get(r["rank"])), "state": _bytes(state.get(r["rank"]))})
    per_rank = ui.table("ranks-table", [
        ("rank", "rank"), ("steps", "steps", ui.NUM), ("compute", "compute", ui.DURATION),
        ("communication", "communication", ui.DURATION), ("idle", "idle", ui.DURATION),
        ("overlap", "communication under compute", ui.num(".0%")), ("slow", "steps as the slow rank", ui.NUM),
        ("waited", "the others waited for it", ui.DURATION), ("memory", "peak live memory"),
        ("state", "optimizer state")],
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
                html.P(id="ranks-clock", className="muted", children=_CLOCKS[analysis.clock]),
                html.P("Communication: collectives (all_reduce, all_gather, ...); compute: every other op; idle: "
                       "the rest of a rank's step window (first op's start to last op's end). A collective ends when "
                       "its last rank arrives, so in each step the slow rank is the one that waits least in it, and "
                       "the others wait for it as long as they waited more; the slowest rank is the one they waited "
                       "for longest in all. Memory: the peak live bytes its ops recorded (— where they recorded "
                       "none).", className="muted")),
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
