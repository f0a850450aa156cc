"""Colors and the plotly template: one color per op type everywhere (timeline, tables, charts)."""
from __future__ import annotations

import hashlib
import zlib

FONT = "Inter, 'Segoe UI', system-ui, -apple-system, Roboto, Helvetica, Arial, sans-serif"
INK = "#1f2933"
MUTED = "#6b7785"
GRID = "#e6e9ee"
ACCENT = "#2563eb"
STACK = "#b08968"            # Python frames (py-spy)
STATUS = {"ok": "#15803d", "running": "#2563eb", "failed": "#b91c1c"}

# Families of ops share a hue, so a timeline reads at a glance (matmuls blue, attention violet, norms green,
# activations amber, elementwise slate/teal); ops of one family that sit side by side in a model differ in
# lightness and shade enough to be told apart at a glance (linear vs matmul, softmax vs attention, add vs mul).
_FIXED = {
    "matmul": "#1e3a8a", "linear": "#60a5fa", "bmm": "#1d4ed8", "addmm": "#3b82f6", "conv2d": "#0c4a6e",
    "scaled_dot_product_attention": "#6d28d9", "softmax": "#e879f9",
    "layer_norm": "#059669", "batch_norm": "#10b981", "group_norm": "#34d399", "rms_norm": "#047857",
    "gelu": "#f59e0b", "relu": "#fbbf24", "silu": "#d97706", "tanh": "#fcd34d", "erf": "#b45309",
    "add": "#475569", "mul": "#0d9488", "sub": "#94a3b8", "div": "#5eead4",
    "transfer": "#dc2626", "embedding": "#0891b2", "dropout": "#a3a3a3",
    # views cost nothing: pale, and warm, so they never read as the gray of spans too small to draw
    "view": "#e7d8c9", "reshape": "#e7d8c9", "permute": "#d6c2ad", "transpose": "#d6c2ad", "contiguous": "#a78b6f",
    "kernel": "#0ea5e9", "memcpy": "#dc2626", "memset": "#f87171",
    # collectives warm (a rank waiting in one reads at a glance), apart from the compute beside them
    "all_reduce": "#e11d48", "all_gather": "#f472b6",
}
_PALETTE = ["#0ea5e9", "#14b8a6", "#84cc16", "#eab308", "#f97316", "#ec4899", "#8b5cf6", "#06b6d4",
            "#22c55e", "#e11d48", "#6366f1", "#a16207", "#0d9488", "#c026d3", "#65a30d", "#ea580c"]
# GPU kernels: their own palette (deep and muted tones the op palette does not use), so a kernel never takes
# the color of a host op beside it on the timeline
_KERNELS = ["#0f766e", "#9d174d", "#3f6212", "#1e40af", "#9a3412", "#6b21a8", "#155e75", "#854d0e",
            "#be123c", "#4338ca", "#166534", "#7c2d12"]
STEP_COLORS = ("#334155", "#64748b")    # the step track: alternate shades, so back-to-back steps stay apart


def op_color(op: str) -> str:
    """The same op gets the same color in every page and every run (a hash, not an index)."""
    if op in _FIXED:
        return _FIXED[op]
    return _PALETTE[zlib.crc32(str(op).encode()) % len(_PALETTE)]


def span_color(name: str, group: str) -> str:
    """A timeline span's color: its op's; a GPU kernel's from its own name (an sgemm never looks like a
    softmax kernel); a Python frame's and a step's their own."""
    if group == "kernel":        # md5, not crc32: crc32 gave an sgemm and a gelu kernel one color
        return _KERNELS[int(hashlib.md5(str(name).encode()).hexdigest()[:8], 16) % len(_KERNELS)]
    if group == "python frame":
        return STACK
    if group == "annotation":    # record_function names, runtime calls: each its own (hashed) color
        return op_color(name)
    if group == "step":
        try:
            return STEP_COLORS[int(str(name).rsplit(" ", 1)[-1]) % 2]
        except ValueError:
            return STEP_COLORS[0]
    return op_color(group)


def kernel_colors(names_by_time) -> dict[str, str]:
    """A run's GPU kernels, busiest first: each of the first len(_KERNELS) gets a palette color of its own (a hash
    of a dozen names collides on a dozen colors, and two of the busiest kernels would look alike); the rest keep
    their hashed color."""
    return {name: _KERNELS[i] for i, name in enumerate(list(names_by_time)[:len(_KERNELS)])}


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
