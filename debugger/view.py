"""Text for the debugger's panels: pure functions from controller events to Rich text.

Kept apart from app.py so the widgets stay thin and these can be read (and tested) alone.
"""
from __future__ import annotations

import linecache
import os

from rich.markup import escape
from textual.content import Content

from .stats import fmt


def short_path(path: str) -> str:
    """site-packages/torch/nn/modules/linear.py -> torch/nn/modules/linear.py; cwd-relative otherwise."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else path
    except ValueError:
        return path


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e9:.0f} ns"


def source_snippet(source: str, around: int = 1) -> list[tuple[int, str, bool]]:
    """[(line number, text, is the line)] around `file.py:123`."""
    if not source or ":" not in source:
        return []
    path, _, line = source.rpartition(":")
    try:
        n = int(line)
    except ValueError:
        return []
    rows = []
    for i in range(max(1, n - around), n + around + 1):
        text = linecache.getline(path, i)
        if text:
            rows.append((i, text.rstrip("\n"), i == n))
    return rows


PHASE_STYLE = {"forward": "green", "backward": "magenta", "optimizer": "blue"}


def op_panel(stop, total_ops: int, compact: bool = False) -> str:
    """The op panel, most important first (a short terminal cuts the bottom): what stopped and why,
    the verdict against the reference, the NaN sentence, then where the op is in the model and
    in the Python source."""
    n = stop.node
    phase = f" [b {PHASE_STYLE.get(stop.phase, 'white')}]{stop.phase}[/]" if stop.phase else ""
    head = (f"[b]{escape(n.name)}[/] [b cyan]{escape(n.op)}[/]{phase} [dim]#{stop.seq + 1}/{total_ops}"
            f" step {stop.step}[/]")
    if stop.history:
        lines = [head, f"[b magenta]{escape(stop.history)}[/] [dim](p back, n forward, l live)[/]"]
    else:
        lines = [head + f"  [b yellow]stopped:[/] {escape(stop.reason)}"]
    d = stop.diff
    if d is not None:
        if not d.compared:
            lines.append(f"[dim]vs reference:[/] [yellow]{escape(d.note)}[/]")
        else:
            colour = "red" if d.introduced else ("yellow" if d.exceeds or d.nan_mismatch else
                                                 ("magenta" if d.nan_both else "green"))
            lines.append(f"[b {colour}]{escape(d.verdict())}[/]")
            lines.append(f"[dim]vs reference[/] {escape(d.summary())}")
    if stop.nan_origin:
        lines.append(f"[b red]NaN/Inf:[/] {escape(stop.nan_origin)}")
    if stop.backward_of:
        lines.append(f"[b magenta]{escape(stop.backward_of)}[/]")
    if stop.dropped:
        lines.append("[dim]values not kept: older than the history budget (--history-mb); stats as they were[/]")
    note = f" [dim]({escape(stop.time_note)})[/]" if stop.time_note else (" [dim](simulated)[/]" if stop.simulated else "")
    lines.append(f"[dim]module[/] {escape(n.module_path or '(model)')} [dim]{escape(n.module_type)}[/]  "
                 f"[dim]on[/] {escape(stop.backend)}{' [yellow](fallback)[/]' if stop.fallback else ''}"
                 f"  [dim]time[/] {fmt_seconds(stop.seconds)}{note}")
    frames = stop.stack or []
    if n.source:
        path, _, line = n.source.rpartition(":")
        code = frames[0].code if frames and frames[0].where == n.source else n.source_line
        lines.append(f"[dim]source[/] {escape(short_path(path))}:{line}  [b]{escape(code.strip())}[/]")
    if stop.locals:      # the op's Python frame as it was traced: what the user's names held
        lines.append("[dim]locals[/] " + escape("  ".join(f"{k}: {v}" for k, v in stop.locals)))
    callers = [f for f in frames if f.where != n.source][: (1 if compact else 4)]
    for f in callers:
        lines.append(f"[dim]  called from {escape(short_path(f.path))}:{f.line} in {escape(f.function)}:[/] "
                     f"{escape(f.code)}")
    if not compact and n.source:
        for i, text, here in source_snippet(n.source):
            mark = "[b yellow]>[/]" if here else " "
            body = f"[b]{escape(text)}[/]" if here else f"[dim]{escape(text)}[/]"
            lines.append(f" {mark}{i:5d} {body}")
    return "\n".join(lines)


def failed_panel(ev, total_ops: int) -> str:
    lines = ["[b red]the model raised[/]"]
    if ev.node is not None:
        n = ev.node
        lines.append(f"[dim]at[/] [b]{escape(n.name)}[/] [dim]op[/] [b cyan]{escape(n.op)}[/] "
                     f"[dim]#{(ev.seq or 0) + 1}/{total_ops} module[/] {escape(n.module_path or '(model)')}")
        if n.source:
            path, _, line = n.source.rpartition(":")
            lines.append(f"[dim]source[/] {escape(short_path(path))}:{line}  {escape(n.source_line.strip())}")
    lines.append(f"[red]{escape(ev.message)}[/]")
    lines.append("[dim]r restarts the run; the inputs of the failing op are below[/]")
    return "\n".join(lines)


def finished_panel(ev) -> str:
    return (f"[b green]run finished[/]: {ev.ops} ops, step {ev.step}.  "
            "[dim]r runs it again; the model's outputs are below[/]")


# nan and inf right after the name and shape: a narrow terminal cuts the columns on the right
COLUMNS = ("tensor", "shape", "dtype", "nan", "inf", "min", "max", "mean", "std", "histogram", "device")
_RIGHT = {3, 4, 5, 6, 7, 8}          # numbers line up on the right


def stats_cells(s) -> list[tuple[str, str]]:
    """(text, style) per column for one tensor's stats."""
    if s.note and not s.numel:
        return [(s.name, ""), ("-", ""), (s.dtype, "")] + [("", "")] * 6 + [(s.note, "dim"), (s.device, "dim")]
    bad = "bold red"
    return [(s.name, "bold"), ("x".join(map(str, s.shape)) or "scalar", ""), (s.dtype, ""),
            (str(s.nan), bad if s.nan else "dim"), (str(s.inf), bad if s.inf else "dim"),
            (fmt(s.min), ""), (fmt(s.max), ""), (fmt(s.mean), ""), (fmt(s.std), ""), (s.sparkline, "cyan"),
            (s.device, "dim")]


def stats_table(stats) -> tuple[Content, list[Content]]:
    """The tensors table as Content lines (header, rows), columns padded to their widest cell."""
    rows = [stats_cells(s) for s in stats]
    widths = [max([len(h)] + [len(r[i][0]) for r in rows]) for i, h in enumerate(COLUMNS)]

    def line(cells, header=False):
        parts = [" "]
        for i, ((text, style), w) in enumerate(zip(cells, widths)):
            padded = text.rjust(w) if i in _RIGHT else text.ljust(w)
            parts.append((padded, "bold" if header else style) if (style or header) else padded)
            parts.append("  ")
        return Content.assemble(*parts[:-1])
    return line([(h, "") for h in COLUMNS], header=True), [line(r) for r in rows]


def watches_text(watches) -> str:
    if not len(watches):
        return "[dim]no watches: w adds one (out.mean(), inputs[0].std())[/]"
    from .stats import sparkline
    lines = []
    for k, w in enumerate(watches, 1):
        nums = w.numbers()[-16:]
        trend = ""
        if len(nums) > 1:
            lo, hi = min(nums), max(nums)
            trend = sparkline([1 + (7 * (v - lo) / (hi - lo) if hi > lo else 0) for v in nums])
        prev = " ".join(t for _, t, _ in w.history[-4:-1])
        lines.append(f"[dim]{k}[/] [b]{escape(w.expr)}[/] = [cyan]{escape(w.last)}[/] {trend}")
        if prev:
            lines.append(f"   [dim]before: {escape(prev)}[/]")
    return "\n".join(lines)
