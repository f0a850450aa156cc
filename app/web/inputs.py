"""What a callback may be sent: each callback checks its inputs here first.

    status = inputs.run_status(status)       # None, or the header's {run, status, events, dropped}
    row = inputs.clicked_row(cell)           # an AG Grid cellClicked's row id, or None
    by = inputs.choice(by, "group by", ("op", "module", "node"))

Anyone holding the token can POST any JSON to /_dash-update-component. A value no page of ours sends
(a list where a run id goes, a number for a search text) raises BadInput, which the server answers
with a 400 and one line (server.py). Only these checks raise it: an exception from a callback given
valid inputs stays a 500 with its traceback in the log, so a real bug is never dressed up as bad input.
"""
from __future__ import annotations

import math

TEXT_MAX = 10_000        # characters: a run id, a search text, a URL's query; far past anything a page sends
INT64 = 2**63


class BadInput(ValueError):
    """A callback input (or page URL parameter) of a type or size no page of ours sends."""


def text(value, name: str, limit: int = TEXT_MAX) -> str | None:
    """None or a string of at most `limit` characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise BadInput(f"{name} is {len(value):,} characters long; at most {limit:,}")
    return value


def query(value, name: str) -> str | None:
    """A page's URL parameter (?run=, ?step=, ...): one string; Dash passes a repeated one as a list."""
    if isinstance(value, list):
        raise BadInput(f"?{name}= appears {len(value)} times in the URL; give it once")
    return text(value, f"?{name}=")


def integer(value, name: str, lo: int = -INT64, hi: int = INT64 - 1) -> int:
    """A whole number (an int, or a float with no fraction: JSON does not tell them apart) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"{name} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise BadInput(f"{name} must be a whole number, not {value!r}")
    if not lo <= value <= hi:
        raise BadInput(f"{name} must be within {lo}..{hi}")
    return int(value)


def number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput(f"{name} must be a finite number")
    return float(value)


def choice(value, name: str, options: tuple):
    """One of `options`, or None (a control not drawn yet)."""
    if value is not None and (not isinstance(value, (str, int, float)) or value not in options):
        shown = repr(value) if isinstance(value, (str, int, float)) and len(repr(value)) < 40 else type(value).__name__
        raise BadInput(f"{name} must be one of {', '.join(map(str, options))}, not {shown}")
    return value


def mapping(value, name: str) -> dict | None:
    """None or a JSON object (a dcc.Store this page wrote)."""
    if value is not None and not isinstance(value, dict):
        raise BadInput(f"{name} must be an object, not {type(value).__name__}")
    return value


def run_status(value) -> dict | None:
    """The header's RUN_STATUS store, as server.py's status callback writes it: None when there are no runs."""
    if value is None:
        return None
    mapping(value, "run status")
    if not text(value.get("run"), "run status's run"):
        raise BadInput("run status has no run id")
    text(value.get("status"), "run status's status")
    for key in ("events", "dropped"):
        integer(value.get(key, 0), f"run status's {key}", 0)
    return value


def status_run(data, status) -> dict | None:
    """The run a RUN_STATUS names, from the store: None when there is none, or the id names no run (forged, deleted)."""
    return data.run(status["run"]) if run_status(status) else None


def clicked_row(cell) -> str | None:
    """The row id of an AG Grid cellClicked event (None before any click)."""
    cell = mapping(cell, "cellClicked")
    return text(cell.get("rowId"), "cellClicked's rowId") if cell else None


def row_ids(rows, name: str) -> list[str]:
    """The ids of AG Grid rows (selectedRows): a list of objects, each with a string id."""
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise BadInput(f"{name} must be a list, not {type(rows).__name__}")
    out = []
    for r in rows:
        rid = text(mapping(r, f"a row of {name}").get("id") if r is not None else None, f"a row id in {name}")
        if not rid:
            raise BadInput(f"a row of {name} has no id")
        out.append(rid)
    return out
