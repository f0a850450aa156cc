"""Hardware: CPU/GPU utilization, memory, temperature and power sampled while the run ran."""
from __future__ import annotations

import numpy as np
from dash import Input, Output, dcc, html

from opscope.app.web import components as ui
from opscope.app.web import ids, inputs, theme

PATH = "/hardware"
NAME = "Hardware"
PLOTS = True         # draws plotly figures: the server starts plotly.js as the page loads (server._EARLY)

METRICS = [("cpu_percent", "CPU utilization (100 % = one busy core)", "%", 1.0), ("mem_bytes", "host memory", "MiB", 2**20),
           ("gpu_util", "GPU utilization", "%", 1.0), ("gpu_mem_bytes", "GPU memory", "MiB", 2**20),
           ("temperature_c", "temperature", "°C", 1.0), ("power_w", "power", "W", 1.0)]


def layout(**_query):
    return html.Div(id=ids.HW_GRAPH, children=ui.note("loading…"))


def register(app, data):
    @app.callback(Output(ids.HW_GRAPH, "children"), Input(ids.RUN_STATUS, "data"))
    def render(status):
        run = inputs.status_run(data, status)
        if not run:
            return ui.note("No runs yet.")
        hw = data.hardware(run["run_id"])
        if not len(hw.get("t_ns", [])):
            return ui.card("Hardware", ui.note("Hardware samples not available for this run (none were recorded)."))
        cols = {k: _floats(v) for k, v in hw.items()}
        # A runner that has exited but is not reaped yet reads as 0 bytes resident: not a sample of the run.
        keep = cols["mem_bytes"] != 0 if "mem_bytes" in cols else slice(None)
        cols = {k: v[keep] for k, v in cols.items()}
        t = (cols["t_ns"] - cols["t_ns"][0]) / 1e9
        cards = []
        for key, title, unit, scale in METRICS:
            v = cols.get(key, np.zeros(0))
            # The store reads a missing integer sample (GPU memory without NVML) as 0: all zeros is "none".
            if not len(v) or np.all(np.isnan(v)) or (key == "gpu_mem_bytes" and not np.nansum(v)):
                cards.append(ui.card(title, ui.note(f"{title}: not available on this machine", "muted")))
                continue
            fig = {"data": [dict(type="scatter", mode="lines+markers", x=t.tolist(), y=(v / scale).tolist(),
                                 line=dict(color=theme.ACCENT, width=2), marker=dict(size=4), name=title,
                                 hovertemplate=f"%{{y:.1f}} {unit} at %{{x:.2f}} s<extra></extra>")],
                   "layout": theme.layout(height=220, margin=dict(l=50, r=10, t=10, b=35),
                                          xaxis=dict(title=dict(text="seconds")),
                                          yaxis=dict(title=dict(text=unit), rangemode="tozero"))}
            cards.append(ui.card(title, dcc.Graph(figure=fig, config={"displaylogo": False})))
        return html.Div(cards, className="grid-2")


def _floats(col) -> np.ndarray:
    """A store column as float64 with NaN for missing samples (NULLs come back masked, or as None)."""
    if isinstance(col, np.ma.MaskedArray):
        return np.ma.filled(col.astype(np.float64), np.nan)
    return np.asarray([np.nan if x is None else x for x in col], np.float64)
