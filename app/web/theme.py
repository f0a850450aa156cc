"""Colors and the plotly template: one color per op type everywhere (timeline, tables, charts)."""
from __future__ import annotations

import zlib

FONT = "Inter, 'Segoe UI', system-ui, -apple-system, Roboto, Helvetica, Arial, sans-serif"
INK = "#1f2933"
MUTED = "#6b7785"
GRID = "#e6e9ee"
ACCENT = "#2563eb"
STACK = "#b08968"            # Python frames (py-spy)
STATUS = {"ok": "#15803d", "running": "#2563eb", "failed": "#b91c1c"}

# Families of ops share a hue, so a timeline reads at a glance: matmuls blue, norms green...
_FIXED = {
    "matmul": "#2563eb", "linear": "#3b82f6", "bmm": "#1d4ed8", "addmm": "#60a5fa", "conv2d": "#1e40af",
    "scaled_dot_product_attention": "#7c3aed", "softmax": "#a855f7",
    "layer_norm": "#059669", "batch_norm": "#10b981", "group_norm": "#34d399", "rms_norm": "#047857",
    "gelu": "#f59e0b", "relu": "#fbbf24", "silu": "#d97706", "tanh": "#fcd34d", "erf": "#b45309",
    "add": "#64748b", "mul": "#94a3b8", "sub": "#475569", "div": "#cbd5e1",
    "transfer": "#dc2626", "embedding": "#0891b2", "dropout": "#a3a3a3",
    "view": "#d4d4d8", "reshape": "#d4d4d8", "permute": "#a1a1aa", "transpose": "#a1a1aa", "contiguous": "#71717a",
}
_PALETTE = ["#0ea5e9", "#14b8a6", "#84cc16", "#eab308", "#f97316", "#ec4899", "#8b5cf6", "#06b6d4",
            "#22c55e", "#e11d48", "#6366f1", "#a16207", "#0d9488", "#c026d3", "#65a30d", "#ea580c"]


def op_color(op: str) -> str:
    """The same op gets the same color in every page and every run (a hash, not an index)."""
    if op in _FIXED:
        return _FIXED[op]
    return _PALETTE[zlib.crc32(str(op).encode()) % len(_PALETTE)]


def layout(**kw) -> dict:
    """Plotly layout defaults: light background, readable font, quiet grid."""
    base = dict(
        font=dict(family=FONT, size=12, color=INK),
        paper_bgcolor="white", plot_bgcolor="white",
        margin=dict(l=60, r=20, t=30, b=40),
        hoverlabel=dict(font=dict(family=FONT, size=12), bgcolor="white"),
        xaxis=dict(gridcolor=GRID, zerolinecolor=GRID, linecolor="#cbd2d9"),
        yaxis=dict(gridcolor=GRID, zerolinecolor=GRID, linecolor="#cbd2d9"),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, font=dict(size=11)),
    )
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return base


def empty_figure(message: str, height: int = 260) -> dict:
    """A figure that says what is missing instead of drawing empty axes."""
    return {"data": [], "layout": layout(
        height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=message, showarrow=False, font=dict(size=14, color=MUTED), xref="paper",
                          yref="paper", x=0.5, y=0.5)])}
