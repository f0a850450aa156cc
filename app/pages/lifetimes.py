"""The memory page's allocation lifetimes (profiler/lifetimes.py): allocations paired with frees, the call sites
that hold the peak, and what is never freed. A card of the Memory page, under its live-bytes chart."""
from __future__ import annotations

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

TOP_SITES = 7          # call sites drawn on their own in the chart; the rest are "other sites"
POINTS = 1500          # samples across the chart: a trace of 100,000 allocations still draws at once
_COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2"]
GRAPH = "memory-lifetimes-graph"
LEAKS = "memory-leaks"


def card():
    return ui.card("Allocations paired with frees", html.Div(id=ids.MEM_LIFETIMES, children=ui.note("loading…")))


def register(app, data):
    @app.callback(Output(ids.MEM_LIFETIMES, "children"), Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return ui.note("No runs yet.")
        key = ("lifetimes", run["run_id"], int(run.get("events") or 0), run.get("status"))
        from opscope.profiler.lifetimes import lifetimes
        life = data._memoized(key, lambda: lifetimes(data.store, run))
        if life is None:
            return ui.note(_missing(run))
        origin = _origin(data, run, life)
        return html.Div([_summary(life, origin, ui.clock_caption(data.clocks(run))), dcc.Graph(id=GRAPH, figure=figure(life, origin),
                                                           config={"displaylogo": False}),
                         html.H4("By call site", className="card-title"), _site_table(life),
                         html.H4("Never freed", className="card-title"), _leak_table(life, origin, run)])


def _missing(run: dict) -> str:
    if run.get("engine") == "import":
        return ("This trace has no allocation addresses to pair: record it with torch.profiler's "
                "profile_memory=True (its [memory] events carry Addr and Bytes) and import it again.")
    return ("This run has no buffer lifetimes: runs recorded by `opscope profile` (graph engine) keep them; eager "
            "and script runs, and runs recorded before this version, do not.")


def _origin(data, run, life) -> int:
    rows = data.store.query("SELECT min(start_ns) FROM events WHERE run_id = ?", [run["run_id"]])
    first = rows[0][0] if rows and rows[0][0] is not None else None
    return int(first) if first is not None else life["t0"]


def _summary(life, origin, clock: str = ""):
    b, p = life["buffers"], life["peak"]
    n, freed = len(b["bytes"]), int(b["freed"].sum())
    leak = int(b["bytes"][~b["freed"]].sum())
    held = ", ".join(f"{s} ({ui.fmt_bytes(v)})" for s, v in p["held_by"][:3])
    items = [html.Span([html.B(f"{n:,}"), " allocations"]), html.Span([html.B(f"{freed:,}"), " freed"]),
             html.Span([html.B(f"{n - freed:,}"), f" never freed ({ui.fmt_bytes(leak)})"],
                       className="leak" if n - freed else None),
             html.Span(["peak ", html.B(ui.fmt_bytes(p["bytes"])), f" at {ui.fmt_ns(p['t'] - origin)}",
                        f", held by {held}" if held else ""])]
    if life["unpaired_frees"]:
        items.append(html.Span(f"{life['unpaired_frees']:,} frees ({ui.fmt_bytes(life['unpaired_bytes'])}) of memory "
                               "allocated before the trace started (not paired)", className="muted"))
    return html.Div([html.Div(items, className="lifetime-summary"), html.P(
        "Each allocation is paired with the free of the same address (a plan: of the same buffer). Live bytes here "
        "count paired allocations only, so they can read below the allocator's total. Times: since the run's "
        f"first op{f' ({clock})' if clock else ''}.", className="muted")])


def figure(life, origin) -> dict:
    """Live bytes by call site, stacked: the sites holding the most at the peak on their own, the rest as one."""
    b, sites = life["buffers"], life["sites"]
    top = [s["site"] for s in sites[:TOP_SITES]]
    rank = {s["index"]: r for r, s in enumerate(sites)}          # sites come biggest at the peak first
    band = np.array([min(rank.get(i, TOP_SITES), TOP_SITES) for i in range(len(life["site_names"]))])[b["site"]]
    t0, t1 = life["t0"], max(life["t_end"], life["t0"] + 1)
    grid = np.unique(np.concatenate([np.linspace(t0, t1, POINTS).astype(np.int64), [life["peak"]["t"]]]))
    traces = []
    for k in range(min(TOP_SITES, len(sites)) + (1 if len(sites) > TOP_SITES else 0)):
        m = band == k
        if not m.any():
            continue
        a, f, freed, size = b["alloc_ns"][m], b["free_ns"][m], b["freed"][m], b["bytes"][m]
        live = np.zeros(len(grid))
        ta = np.searchsorted(grid, a, "left")            # at and after its allocation
        np.add.at(live, np.minimum(ta, len(grid) - 1), size)
        tf = np.searchsorted(grid, f[freed], "right")    # after its free
        inside = tf < len(grid)
        np.add.at(live, tf[inside], -size[freed][inside])
        name = top[k] if k < len(top) else "other sites"
        color = _COLORS[k] if k < len(_COLORS) else "#9aa5b1"
        traces.append(dict(type="scatter", mode="lines", x=((grid - origin) / 1e6).tolist(),
                           y=(np.cumsum(live) / 2**20).tolist(), name=_short(name), stackgroup="one",
                           line=dict(width=0.5, shape="hv", color=color),
                           hovertemplate="%{y:.3f} MiB at %{x:.3f} ms<extra>" + _short(name, 60) + "</extra>"))
    p = life["peak"]
    return {"data": traces, "layout": theme.layout(
        height=380, hovermode="closest", legend=dict(orientation="h", y=1.02, yanchor="bottom", traceorder="normal"),
        margin=dict(t=70),
        annotations=[dict(x=(p["t"] - origin) / 1e6, y=p["bytes"] / 2**20, text=f"peak {ui.fmt_bytes(p['bytes'])}",
                          showarrow=True, arrowhead=0, ax=0, ay=-24, font=dict(size=12, color=theme.INK))],
        xaxis=dict(title=dict(text="time since the run's first op (ms)")),
        yaxis=dict(title=dict(text="live MiB (paired allocations)"), rangemode="tozero"))}


def _short(text: str, n: int = 48) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _site_table(life):
    rows = [{"id": str(i), "site": s["site"], "allocations": s["allocations"], "bytes": ui.fmt_bytes(s["bytes"]),
             "at_peak": ui.fmt_bytes(s["at_peak"]), "at_peak_n": s["at_peak"],
             "never": f"{s['never_freed']:,} ({ui.fmt_bytes(s['never_freed_bytes'])})" if s["never_freed"] else "0",
             "median": s["median_life_ns"], "max": s["max_life_ns"]} for i, s in enumerate(life["sites"])]
    return ui.table(ids.MEM_SITES, [("site", "call site (op · module)", {"maxWidth": 520}), ("allocations", "allocations", ui.NUM),
                                   ("bytes", "allocated", ui.RIGHT), ("at_peak", "held at the peak", ui.RIGHT),
                                   ("never", "never freed", ui.RIGHT), ("median", "median lifetime", ui.DURATION),
                                   ("max", "longest lifetime", ui.DURATION)], rows, page_size=15)


def _leak_table(life, origin, run):
    b = life["buffers"]
    idx = np.flatnonzero(~b["freed"])
    if not len(idx):
        return ui.note("Every allocation was freed.", "ok")
    names = life["site_names"]
    idx = idx[np.argsort(-b["bytes"][idx], kind="stable")][:50]
    kept = ("kept past the step: an output returned to the caller or a value carried to the next step"
            if run.get("engine") != "import" else "not freed before the trace ended")
    rows = [{"id": str(i), "site": names[b["site"][i]], "bytes": ui.fmt_bytes(b["bytes"][i]),
             "at": float(b["alloc_ns"][i] - origin), "device": str(b["device"][i])} for i in idx.tolist()]
    return html.Div([html.P(f"The largest {len(rows)} of {int((~b['freed']).sum()):,}: {kept}.", className="muted"),
                     ui.table(LEAKS, [("site", "call site"), ("bytes", "bytes", ui.RIGHT),
                                      ("at", "allocated at", ui.DURATION), ("device", "device")], rows, page_size=10)])
