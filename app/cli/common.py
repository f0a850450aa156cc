"""Helpers every command shares: --json output, tables, number formats."""
from __future__ import annotations

import json
import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# Piped output (a file, `less`, CI logs) gets a wide console: rich's 80-column default would
# wrap every number of a per-op table over two lines.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


MODEL_HELP = "demo:NAME or path/to/file.py:factory"
BACKEND_HELP = "numpy, torch:DEVICE, sim:NAME or a .toml file"


def add_model_and_backend(p) -> None:
    """The two arguments every command that runs a model takes, spelled the same everywhere."""
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--backend", "-b", default="torch:cpu", help=BACKEND_HELP)


def add_json(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, set):
        return sorted(o)
    return str(o)


def _finite(o):
    """JSON has no NaN/Infinity: write them as null (the schema says so)."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(_finite(data), default=_default, indent=1) + "\n")


def table(title: str, columns: list[str], rows: list[list], justify_right=None) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c, justify="right" if justify_right and c in justify_right else "left", no_wrap=True,
                     overflow="ellipsis")
    for r in rows:      # cells are data, never markup: "[operators]" must print as written
        t.add_row(*[x if isinstance(x, Text) else Text(str(x)) for x in r])
    return t


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_flops(f: float) -> str:
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP/s"
