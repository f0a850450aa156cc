"""Errors a user can cause, and the exit code each one maps to (DESIGN.md: exit codes)."""

import re

_WHERE_ONLY = re.compile(r"^Exception from \S+:\d+:$")    # OpenVINO's C++ frames: a file and line, no reason


def first_line(e: BaseException) -> str:
    """The first line of an exception's message that says something (torch and numpy messages run to
    pages; OpenVINO's start with a line per C++ frame it passed through)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return next((ln for ln in lines if not _WHERE_ONLY.match(ln)), lines[0] if lines else "")


# C0 (ESC, BEL, \n, \r, \t ...), DEL, C1 (0x9b is a one-byte CSI), and the Unicode controls that move or reorder
# text: line and paragraph separators, bidirectional overrides and isolates ("Trojan Source")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def terminal_text(value) -> str:
    """Text that came from an artifact (a run's model or backend, a rank's error, a trace's names, a file's
    contents) made safe for a terminal: one line, every control character shown escaped (`\\x1b`, `\\n`), so
    ESC[2J cannot clear the screen, OSC 0 cannot retitle the window and "\\n\\x1b[31m" cannot forge a red line.
    The console's say() and table(), the TUI's say() and the CLI's error line pass every such value through it
    (markup is the other half: say() never parses a value as markup)."""
    return _CONTROL.sub(_escaped, str(value))


def signal_name(signum: int) -> str:
    """How a child that died by signal `signum` is named in a message: SIGKILL, or "signal 99" for a number this
    platform has no name for (a negative exit code past the table must not raise while an error is reported)."""
    import signal
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class OpscopeError(Exception):
    """Base class: the message is one line that says what, where, and what to do."""

    exit_code = 1


class UsageError(OpscopeError):
    """Bad input or usage: a spec that names nothing, a malformed file, a bad flag (exit 2)."""

    exit_code = 2


class ModelError(OpscopeError):
    """The model or the work failed (exit 1)."""

    exit_code = 1


class UnsupportedOpError(UsageError):
    """Ops that no backend in the placement can run; lists them all at once."""

    def __init__(self, message: str, ops: list[str] | None = None):
        super().__init__(message)
        self.ops = ops or []
