"""Helpers every command shares: --json output, tables, number formats."""
from __future__ import annotations

import json
import math
import os
import re
import string
import sys

from rich.console import Console
from rich.markup import render
from rich.table import Table
from rich.text import Text

from opscope.runtime.errors import terminal_text

# Piped output (a file, `less`, CI logs) gets a wide console: rich's 80-column default would
# wrap every number of a per-op table over two lines. $COLUMNS, when set, wins (a terminal's width).
class _Console(Console):
    def on_broken_pipe(self) -> None:
        """`opscope runs | head`: rich would exit 1; the CLI's main() treats a closed pipe as success."""
        self.quiet = True
        raise BrokenPipeError


console = _Console(highlight=False, soft_wrap=True, emoji=False,
                  width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160)

_FIELDS = string.Formatter()
_SLOT = re.compile("\0(\\d+)\0")


def say(template: str, *values, **names) -> Text:
    """A line of console markup written here in code, its `{}` fields (str.format's syntax, specs
    included) filled with names that come from files, traces and models: backends, ops, providers,
    module paths, rule ids, run labels. The ONE way a name reaches the console: it never passes
    through the markup parser (its field is a placeholder the parser ignores, replaced by the name
    afterwards in the style around it), so `x[/]y`, `[bold]` or a trailing backslash print as written
    instead of raising MarkupError or restyling the line. Escaping by construction, not by regex:
    rich.markup.escape leaves `a\\` followed by a tag wrong. Each name is also one line with its control
    characters shown escaped (terminal_text: no ESC reaches the terminal). Data cells go through `table()`."""
    filled, parts, auto = [], [], 0
    for literal, field, spec, conv in _FIELDS.parse(template):
        parts.append(literal)
        if field is None:
            continue
        if field == "":
            field, auto = str(auto), auto + 1
        value = _FIELDS.convert_field(_FIELDS.get_field(field, values, names)[0], conv)
        filled.append(terminal_text(format(value, spec or "")))
        parts.append(f"\0{len(filled) - 1}\0")
    styled = render("".join(parts), emoji=False)
    out, pos = Text(), 0
    for m in _SLOT.finditer(styled.plain):
        out.append_text(styled[pos:m.start()])
        name = Text(filled[int(m.group(1))])
        for span in styled[m.start():m.end()].spans:       # the style the template gives the field
            name.stylize(span.style)
        out.append_text(name)
        pos = m.end()
    out.append_text(styled[pos:])
    return out


def safe_text(value) -> Text:
    """A table cell, title or header as rich Text that nothing parses, its control characters escaped
    (terminal_text); a styled Text written here keeps its style unless it holds one."""
    if isinstance(value, Text):
        plain = value.plain
        return value if terminal_text(plain) == plain else Text(terminal_text(plain), style=value.style)
    return Text(terminal_text(value))


# Columns a table must never squeeze to "…": the row's name and where it is in the user's code.
KEY_COLUMNS = {"file:line", "location", "where", "line", "file", "path", "spec", "op", "run", "node", "module"}


OPTIMIZERS = ("sgd", "adamw")       # runtime/train's; listed here so parsing needs no torch import
MODEL_HELP = "demo:NAME or path/to/file.py:factory"
BACKEND_HELP = "numpy, torch:DEVICE, sim:NAME or a .toml file"


def add_model_and_backend(p) -> None:
    """The two arguments every command that runs a model takes, spelled the same everywhere."""
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--backend", "-b", default="torch:cpu", help=BACKEND_HELP)
    p.set_defaults(precheck=check_specs)


# A bad value is refused while argparse parses (types below) or in the command's precheck(args), both before
# torch is imported (main() imports it before running a command): a typo costs a tenth of a second, not the
# two seconds of CPU (25 s wall on a loaded machine) torch takes.
def check_specs(args, model: str | None = "model", backends=("backend", "reference")) -> None:
    """The model and backend specs in `args` checked by their form and files (runtime/specs.py). main() calls a
    command's `precheck(args)` after parsing, before torch is imported; the form is not argparse's to check
    (`opscope run MODEL` in a message or an example is a synopsis that parses)."""
    from opscope.runtime.specs import check_backend_spec, check_model_spec
    if model and getattr(args, model, None) is not None:
        check_model_spec(getattr(args, model))
    for dest in backends:
        value = getattr(args, dest, None)
        for spec in value if isinstance(value, list) else [value] if value is not None else []:
            check_backend_spec(spec)
    for value in getattr(args, "fallback", None) or ():       # --fallback a,b (runtime/fallback.py's form)
        for spec in filter(None, (s.strip() for s in value.split(","))):
            check_backend_spec(spec)
    # --hybrid A=0.7,B=0.3: each backend's name; the shares and the auto forms are the dist runtime's to check
    for part in (getattr(args, "hybrid", None) or "").split(","):
        spec = part.rpartition("=")[0].strip()
        if spec and not spec.startswith("auto"):
            check_backend_spec(spec)


def choice_arg(what: str, names):
    """argparse type for one of `names` (an optimizer, a format): 'unknown optimizer 'adam': use sgd or adamw
    (did you mean adamw?)' instead of argparse's list of choices."""
    import argparse

    from opscope.runtime.specs import did_you_mean

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}: use {' or '.join(names)}"
                                             f"{did_you_mean(text, names)}")
        return text
    parse.__name__ = what
    return parse


def add_fallback(p) -> None:
    """--no-fallback and --fallback BACKEND, for the commands that place a model (run, train, profile)."""
    p.add_argument("--no-fallback", action="store_true", help="fail, listing every op the backend cannot run")
    p.add_argument("--fallback", action="append", metavar="BACKEND",
                   help="for this run, also send ops the backend and its description's fallbacks cannot run to "
                        "BACKEND (e.g. torch:cpu); repeat or comma-separate for a chain")


def fallback_of(args):
    """What placement's allow_fallback gets: False, True (the description's chain) or that chain plus --fallback's
    backends (runtime/fallback.py); a --fallback that names no backend is refused here, before the model loads."""
    from opscope.runtime.errors import UsageError
    from opscope.runtime.fallback import parse_flag
    specs = parse_flag(getattr(args, "fallback", None))
    if not specs:
        return not args.no_fallback
    if args.no_fallback:
        raise UsageError("--fallback and --no-fallback contradict each other: give one")
    from opscope.runtime.backends import resolve
    for spec in specs:
        resolve(spec)
    return specs


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
    """A rich table that fits the console (100 columns included) without dropping a column: the first
    column, the KEY_COLUMNS (file:line, op, ...), numbers and short text keep their width; long text
    columns share what is left and wrap. (Left to rich, a wide text column squeezed `file:line` to "…".)"""
    right = set(justify_right or ())
    cells = [[safe_text(x) for x in r] for r in rows]
    widths = [max([len(c)] + [r[i].cell_len for r in cells if i < len(r)]) for i, c in enumerate(columns)]
    # short columns (a kind, a status) gain nothing from wrapping: only long text wraps
    fixed = {i for i, c in enumerate(columns) if i == 0 or c in KEY_COLUMNS or c in right or widths[i] <= 16}
    room = console.width - (3 * len(columns) + 1) - sum(min(widths[i], 48) for i in fixed)
    flexible = [i for i in range(len(columns)) if i not in fixed]
    want = sum(widths[i] for i in flexible)
    give = {}
    if flexible and want > room:         # share the room in proportion to what each column wants
        # NOTE: a wrapping column keeps at least its header, and 12 only when the room allows it:
        # a floor of 12 each pushed a table with a long file:line key past 100 columns
        floor = min(12, max(room, 0) // len(flexible))
        for i in flexible:
            give[i] = max(min(widths[i], max(len(columns[i]), floor)), int(room * widths[i] / want))
    # the title and headers name backends and ops too: Text, never markup (see say())
    t = Table(title=safe_text(title), title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        wraps = i in give
        t.add_column(safe_text(c), justify="right" if c in right else "left", no_wrap=not wraps,
                     overflow="fold" if wraps else "ellipsis", width=give.get(i),
                     min_width=min(widths[i], 48) if i in fixed else None)
    for r in cells:     # cells are data, never markup: "[operators]" must print as written
        t.add_row(*r)
    return t


def fmt_ratio(x: float | None) -> str:
    """B/A as '1.23x', '0.0042x', '1.2e-05x': never '0.00x' for a ratio that is not zero."""
    if x is None or not math.isfinite(x):
        return "-" if x is None else f"{x}x"
    if x == 0 or abs(x) >= 0.01:
        return f"{x:.2f}x"
    return f"{x:.2g}x" if abs(x) >= 1e-4 else f"{x:.1e}x"


def count_arg(flag: str, minimum: int = 1):
    """argparse type for a count such as --top or --max-bytes: an int >= `minimum`, else a one-line usage error."""
    import argparse

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{n}: give {minimum} or more")
        return n
    parse.__name__ = flag
    return parse


def number_arg(flag: str, *, above: float | None = None, minimum: float | None = None,
               maximum: float | None = None, whole: bool = False, unit: str = ""):
    """argparse type for a bounded number (--lr above 0, --timeout above 0 and at most 600, --sim-load 0 to 1, a port
    0 to 65535): refused while parsing, before any heavy import, in one line that says what to give. NaN and
    infinity are refused too (every comparison with NaN is false)."""
    import argparse
    import math

    def num(x) -> str:                   # 1000000, not 1e+06
        return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

    low = "" if above is None and minimum is None else (f"above {num(above)}" if above is not None else num(minimum))
    want = (f"{num(minimum)} to {num(maximum)}" if minimum is not None and maximum is not None
            else f"{low} and at most {num(maximum)}" if low and maximum is not None
            else f"at most {num(maximum)}" if maximum is not None
            else f"{low} or more" if minimum is not None else low)
    want = f"give {'a whole number ' if whole else 'a number '}{want}{' ' + unit if unit else ''}".rstrip()

    def parse(text: str):
        try:
            x = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if whole else ''}number: {want}") from None
        if not (math.isfinite(x) and (above is None or x > above) and (minimum is None or x >= minimum)
                and (maximum is None or x <= maximum)):
            raise argparse.ArgumentTypeError(f"{text}: {want}")
        return x
    parse.__name__ = flag
    return parse


def port_arg(flag: str = "--port"):
    """argparse type for a port to listen on (0 picks a free one)."""
    return number_arg(flag, minimum=0, maximum=65535, whole=True)


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


def output_path(path, flag: str = "-o"):
    """A file the command will write, checked before any work: its folder exists and it is not a folder."""
    from pathlib import Path

    from opscope.runtime.errors import UsageError
    if path is None:
        return None
    out = Path(path)
    if not out.parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {out.parent} does not exist; create it or write elsewhere")
    if out.is_dir():
        raise UsageError(f"{flag} {path} is a folder: give a file name")
    return out
