"""Text for the debugger's panels: pure functions from controller events to Textual Content.

Kept apart from app.py so the widgets stay thin and these can be read (and tested) alone.
"""
from __future__ import annotations

import linecache
import os

from textual.content import Content

from opscope.runtime.errors import terminal_text

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


def say(template: str, **names) -> Content:
    """TUI markup written here in code, its `$name` fields filled with names from the model, its trace
    or what the user typed (op and node names, module paths, breakpoint patterns, messages, source
    lines). The ONE way such a name reaches a panel: Textual substitutes a variable as plain text, never
    as markup, so `x[/]y`, `[bold]`, `[$v]` or a trailing backslash print as written. (rich's escape() is
    not enough for Textual's markup: `[$v]` and `[Bold]` still vanished. Table cells and tree labels
    are rich Text, which nothing parses.) Each name is one line, its control characters shown escaped
    (terminal_text), as on the CLI."""
    return Content.from_markup(template, **{k: terminal_text(v) for k, v in names.items()})


def lines_of(lines: list[Content]) -> Content:
    return Content("\n").join(lines)


PHASE_STYLE = {"forward": "green", "backward": "magenta", "optimizer": "blue"}


def op_panel(stop, total_ops: int, compact: bool = False) -> Content:
    """The op panel, most important first (a short terminal cuts the bottom): what stopped and why,
    the verdict against the reference, the NaN sentence, then where the op is in the model and
    in the Python source."""
    n = stop.node
    phase = f" [b {PHASE_STYLE.get(stop.phase, 'white')}]$phase[/]" if stop.phase else ""
    head = say(f"[b]$name[/] [b cyan]$op[/]{phase} [dim]#{stop.seq + 1}/{total_ops} step {stop.step}[/]",
               name=n.name, op=n.op, phase=stop.phase)
    if stop.history:
        lines = [head, say("[b magenta]$history[/] [dim](p back, n forward, l live)[/]", history=stop.history)]
    else:
        lines = [head + say("  [b yellow]stopped:[/] $reason", reason=stop.reason)]
    d = stop.diff
    if d is not None:
        if not d.compared:
            lines.append(say("[dim]vs reference:[/] [yellow]$note[/]", note=d.note))
        else:
            colour = "red" if d.introduced else ("yellow" if d.exceeds or d.nan_mismatch else
                                                 ("magenta" if d.nan_both else "green"))
            lines.append(say(f"[b {colour}]$verdict[/]", verdict=d.verdict()))
            lines.append(say("[dim]vs reference[/] $summary", summary=d.summary()))
    if n.op == "region":         # one step on a compiler stack: its members' diff is a key away
        ops = list(dict.fromkeys(m.op for m in n.attrs["members"]))
        lines.append(say("[b]region[/] of $count nodes on $backend: $ops [dim](m: each op's diff)[/]",
                         count=len(n.attrs["members"]), backend=n.attrs.get("backend", stop.backend),
                         ops=", ".join(ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")))
    if stop.nan_origin:
        lines.append(say("[b red]NaN/Inf:[/] $origin", origin=stop.nan_origin))
    if stop.backward_of:
        lines.append(say("[b magenta]$of[/]", of=stop.backward_of))
    if stop.dropped:
        lines.append(say("[dim]values not kept: older than the history budget (--history-mb); stats as they were[/]"))
    if stop.computed_dtype:      # the numbers on screen are float32, the chip's arithmetic was not
        declared = next((m.dtype for m in n.output_meta if m is not None), "")
        lines.append(say("[b yellow]computed in $computed[/] [dim]on $backend (outputs stored as $declared)[/]",
                         computed=stop.computed_dtype, backend=stop.backend, declared=declared))
    note = " [dim]($note)[/]" if stop.time_note else (" [dim](simulated)[/]" if stop.simulated else " [dim](wall)[/]")
    lines.append(say("[dim]module[/] $module [dim]$type[/]  [dim]on[/] $backend"
                     + (" [yellow](fallback)[/]" if stop.fallback else "") + "  [dim]time[/] $time" + note,
                     module=n.module_path or "(model)", type=n.module_type, backend=stop.backend,
                     time=fmt_seconds(stop.seconds), note=stop.time_note or ""))
    frames = stop.stack or []
    if n.source:
        path, _, line = n.source.rpartition(":")
        code = frames[0].code if frames and frames[0].where == n.source else n.source_line
        lines.append(say("[dim]source[/] $path:$line  [b]$code[/]", path=short_path(path), line=line, code=code.strip()))
    if stop.locals:      # the op's Python frame as it was traced: what the user's names held
        lines.append(say("[dim]locals[/] $locals", locals="  ".join(f"{k}: {v}" for k, v in stop.locals)))
    callers = [f for f in frames if f.where != n.source][: (1 if compact else 4)]
    for f in callers:
        lines.append(say("[dim]  called from $path:$line in $function:[/] $code", path=short_path(f.path),
                         line=f.line, function=f.function, code=f.code))
    if not compact and n.source:
        for i, text, here in source_snippet(n.source):
            lines.append(say(" [b yellow]>[/]$i [b]$text[/]" if here else "  $i [dim]$text[/]", i=f"{i:5d}", text=text))
    return lines_of(lines)


def failed_panel(ev, total_ops: int) -> Content:
    lines = [say("[b red]the model raised[/]")]
    if ev.node is not None:
        n = ev.node
        lines.append(say(f"[dim]at[/] [b]$name[/] [dim]op[/] [b cyan]$op[/] [dim]#{(ev.seq or 0) + 1}/{total_ops} "
                         "module[/] $module", name=n.name, op=n.op, module=n.module_path or "(model)"))
        if n.source:
            path, _, line = n.source.rpartition(":")
            lines.append(say("[dim]source[/] $path:$line  $code", path=short_path(path), line=line,
                             code=n.source_line.strip()))
    lines.append(say("[red]$message[/]", message=ev.message))
    lines.append(say("[dim]r restarts the run; the inputs of the failing op are below[/]"))
    return lines_of(lines)


def finished_panel(ev) -> Content:
    return say(f"[b green]run finished[/]: {ev.ops} ops, step {ev.step}.  "
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


# what goes, in this order, until the table fits its width (80 columns: every stat of `in1 h.0.attn.qkv.weight`
# stays, with the row of `out`): a parameter's path after its slot name, the device, the histogram, then one of
# the two spaces between columns
_NARROWER = ("path", "device", "histogram", "gap")


def stats_table(stats, width: int | None = None, outputs: int = 0) -> tuple[Content, list[Content], int]:
    """The tensors table as Content lines (header, rows, pinned), columns padded to their widest cell and made
    narrower (_NARROWER) until a line fits `width` characters; pinned: the last `outputs` rows, which the table
    keeps in view however many inputs there are (an op's output is what a stop is about)."""
    cells = [stats_cells(s) for s in stats]
    for level in range(len(_NARROWER) + 1):
        dropped = set(_NARROWER[:level])
        keep = [i for i, c in enumerate(COLUMNS) if c not in dropped]
        rows = [[(r[0][0].split(" ", 1)[0], r[0][1]) if "path" in dropped and i == 0 else r[i] for i in keep]
                for r in cells]
        header = [(COLUMNS[i], "") for i in keep]
        widths = [max([len(h)] + [len(r[j][0]) for r in rows]) for j, (h, _) in enumerate(header)]
        gap = " " if "gap" in dropped else "  "
        if width is None or 1 + sum(widths) + len(gap) * (len(widths) - 1) <= width:
            break
    right = {j for j, i in enumerate(keep) if i in _RIGHT}

    def line(row, bold=False):
        parts = [" "]
        for j, ((text, style), w) in enumerate(zip(row, widths)):
            padded = text.rjust(w) if j in right else text.ljust(w)
            parts.append((padded, "bold" if bold else style) if (style or bold) else padded)
            parts.append(gap)
        return Content.assemble(*parts[:-1])
    return line(header, bold=True), [line(r) for r in rows], min(outputs, len(rows))


def watches_text(watches) -> Content:
    if not len(watches):
        return say("[dim]no watches: w adds one (out.mean(), inputs\\[0].std())[/]")
    from .stats import sparkline
    lines = []
    for k, w in enumerate(watches, 1):
        nums = w.numbers()[-16:]
        trend = ""
        if len(nums) > 1:
            lo, hi = min(nums), max(nums)
            trend = sparkline([1 + (7 * (v - lo) / (hi - lo) if hi > lo else 0) for v in nums])
        prev = " ".join(t for _, t, _ in w.history[-4:-1])
        lines.append(say(f"[dim]{k}[/] [b]$expr[/] = [cyan]$last[/] $trend", expr=w.expr, last=w.last, trend=trend))
        if prev:
            lines.append(say("   [dim]before: $prev[/]", prev=prev))
    return lines_of(lines)
