"""A live progress bar on stderr for work that takes more than a few seconds.

    with progress_bar("profiling demo:gpt", total=50, unit="steps", show=shown(args)) as update:
        update(done=3, note="1,234 events")

Shown only when stderr is a terminal and the command was not asked for --json: piped output, CI logs
and JSON readers get nothing on stderr but errors. It is transient (cleared when the work ends), so the
report printed afterwards reads as before. The layers below never import this: the runtime and the
profiler take a plain callback (`progress=`), and the command turns it into `update`.
"""
from __future__ import annotations

import contextlib
import sys


def shown(args=None) -> bool:
    """Whether a bar is drawn: stderr is a terminal and no --json (a command may add --progress/--no-progress)."""
    if getattr(args, "json", False) or getattr(args, "no_progress", False):
        return False
    return bool(getattr(args, "progress", False)) or sys.stderr.isatty()


def _nothing(**_) -> None:
    pass


@contextlib.contextmanager
def progress_bar(what: str, total: int | None = None, *, unit: str = "", show: bool = True):
    """Yields update(done=None, advance=None, total=None, what=None, note=None). A total of None draws a
    pulsing bar until one is given. Names in `what` and `note` (models, backends, ops) print as written."""
    if not show:
        yield _nothing
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)
    from rich.table import Column
    # a short bar: the counts and the note must fit an 80-column terminal beside a long model name.
    # NOTE: where the line is too long, rich shrinks every column; the description (a model name) gives way,
    # never the counts ("1413/100..." told nobody how far the run was)
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False,
                                           table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
               BarColumn(bar_width=20)]
    if total is not None:                # a status line (spinner, pulsing bar, note) until a total is known
        digits = len(f"{max(int(total), 1):,}") if isinstance(total, (int, float)) else 6
        columns.append(MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=2 * digits + 1)))
        if unit:
            columns.append(TextColumn(unit, markup=False))
    columns += [TextColumn("{task.fields[note]}", markup=False), TimeElapsedColumn()]
    with Progress(*columns, console=Console(file=sys.stderr, highlight=False), transient=True,
                  refresh_per_second=8) as bar:
        task = bar.add_task(what, total=total, note="")

        def update(done=None, advance=None, total=None, what=None, note=None) -> None:
            fields = {k: v for k, v in (("completed", done), ("advance", advance), ("total", total),
                                        ("description", what), ("note", note)) if v is not None}
            bar.update(task, **fields)
        yield update
