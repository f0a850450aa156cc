"""What a callback may be sent: one schema for every input a server-side callback takes, checked before it runs.

    inputs.check_request(body)               # any JSON: text strings (no lone surrogate), bounded depth and size
    inputs.check_input(cid, prop, value)     # SCHEMA[(cid, prop)]: the type and size of what that property holds
    status = inputs.run_status(status)       # None, or the header's {run, status, events, dropped}
    row = inputs.clicked_row(cell)           # an AG Grid cellClicked's row id, or None

Anyone holding the token can POST any JSON to /_dash-update-component. The gate (gate.py) checks each input
and state value against SCHEMA before Dash calls the callback, so a value no page of ours sends (a list where
a run id goes, a lone surrogate that no store or encoder can take, 1 MB of text) raises BadInput, which the
server answers with a 400 and one line. Callbacks call the same checkers on what they use (a second line, and
what layouts given a URL's query rely on). Only these checks raise it: an exception from a callback given valid
inputs stays a 500 with its traceback in the log, so a real bug is never dressed up as bad input.
"""
from __future__ import annotations

import math
import re

from . import ids

TEXT_MAX = 10_000        # characters: a run id, a search text, a URL's query; far past anything a page sends
INT64 = 2**63
DEPTH_MAX = 32           # nesting of a callback body: Dash's own is 4 deep, AG Grid rows 2 more
ROWS_MAX = 100_000       # rows an AG Grid selection may send back (a runs table with every run ticked)
GROUP_BY = ("name", "op", "module", "node", "phase", "category")   # the Operators page's groupings
_SURROGATE = re.compile("[\ud800-\udfff]")      # JSON's \ud800 escape parses to one; UTF-8 cannot encode it


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
    _no_surrogate(value, name)
    return value


def _no_surrogate(value: str, name: str) -> None:
    if not value.isascii() and (m := _SURROGATE.search(value)):
        raise BadInput(f"{name} holds a lone surrogate (U+{ord(m.group()):04X} at {m.start()}): not text")


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


def fields(value, name: str, spec: dict, exact: bool = True) -> dict | None:
    """None or an object whose keys `spec` names, each value passed to its checker; exact: every key of `spec`
    and no other (a store this server writes), else any subset plus keys of no interest (a component's event)."""
    if mapping(value, name) is None:
        return None
    if exact and set(value) != set(spec):
        raise BadInput(f"{name} must have exactly the keys {', '.join(spec)}")
    for key, check in spec.items():
        if key in value:
            check(value[key], f"{name}'s {key}")
    return value


def run_pair(value, name: str) -> list[str] | None:
    """None or two run ids (the Compare page's CMP_SHOWN)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise BadInput(f"{name} must be two run ids")
    return [text(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _whole_or_none(value, name: str):
    return None if value is None else integer(value, name)


def _count(value, name: str) -> int:
    return integer(value, name, 0)


def _scalar(value, name: str):
    """A grid cell's value: text, a number, a flag or nothing."""
    if isinstance(value, str):
        return text(value, name)
    if value is not None and not isinstance(value, (bool, int, float)):
        raise BadInput(f"{name} must be text or a number, not {type(value).__name__}")
    return value


_RUN_STATUS = {"run": text, "status": text, "events": _count, "dropped": _count}
_CELL = {"rowId": text, "colId": text, "value": _scalar, "rowIndex": _whole_or_none, "timestamp": _scalar}


def run_status(value, name: str = "run status") -> dict | None:
    """The header's RUN_STATUS store, as server.py's status callback (or the live poll) writes it: None when there
    are no runs, else exactly {run, status, events, dropped}."""
    if fields(value, name, _RUN_STATUS) is None:
        return None
    if not value["run"]:
        raise BadInput(f"{name} has no run id")
    return value


def status_run(data, status) -> dict | None:
    """The run a RUN_STATUS names (data.status_run: the row its lookup read, else the store's): None when there is
    none, or the id names no run (forged, deleted)."""
    return data.status_run(status) if run_status(status) else None


def clicked_row(cell, name: str = "cellClicked") -> str | None:
    """The row id of an AG Grid cellClicked event (None before any click)."""
    cell = fields(cell, name, _CELL, exact=False)
    return cell.get("rowId") if cell else None


def row_ids(rows, name: str) -> list[str]:
    """The ids of AG Grid rows (selectedRows): a list of objects, each with a string id."""
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise BadInput(f"{name} must be a list, not {type(rows).__name__}")
    if len(rows) > ROWS_MAX:
        raise BadInput(f"{name} has {len(rows):,} rows; at most {ROWS_MAX:,}")
    out = []
    for r in rows:
        rid = text(mapping(r, f"a row of {name}").get("id") if r is not None else None, f"a row id in {name}")
        if not rid:
            raise BadInput(f"a row of {name} has no id")
        out.append(rid)
    return out


def step(value, name: str = "step"):
    """The timeline's step picker: "all" or a step number (None before it is drawn)."""
    if value is None or value == "all":
        return value
    if isinstance(value, str):
        raise BadInput(f"{name} must be 'all' or a step number, not {text(value, name)[:40]!r}")
    return integer(value, name)


def timeline_view(value, name: str = "timeline view") -> dict | None:
    """The timeline's VIEW store, as the page writes it (timeline._view): {run, stamp, step, find}."""
    return fields(value, name, {"run": text, "stamp": text, "step": step, "find": text})


def picked_span(value, name: str = "picked span") -> list | None:
    """The timeline's PICKED store, as timeline.js writes it: [key0, key1, microseconds]."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise BadInput(f"{name} must be [step, seq, microseconds]")
    integer(value[0], f"{name}'s step")
    integer(value[1], f"{name}'s seq")
    number(value[2], f"{name}'s microseconds")
    return value


def area(value, name: str = "area selection") -> dict | None:
    """The timeline's area selection, as assets/timeline_tools.js writes it: {run, t0, t1, tracks} (ns since the
    run's first span; the tracks' indices in the server's order, at most 100,000)."""
    if fields(value, name, {"run": text, "t0": number, "t1": number, "tracks": lambda v, n: v}) is None:
        return None
    if not isinstance(value["tracks"], list) or len(value["tracks"]) > 100_000:
        raise BadInput(f"{name}'s tracks must be a list of at most 100000 track numbers")
    for t in value["tracks"]:
        integer(t, f"{name}'s track", 0, 10**9)
    return value


def group_by(value, name: str = "group by"):
    return choice(value, name, GROUP_BY)


# --- the schema: what each (component, property) a server-side callback takes may hold ------------------------

# Dash's own page router (use_pages) reads its dcc.Location, as the shell's callbacks read ours.
PAGES_LOCATION = "_pages_location"

SCHEMA = {
    (ids.URL, "pathname"): text, (ids.URL, "search"): text,
    (PAGES_LOCATION, "pathname"): text, (PAGES_LOCATION, "search"): text,
    (ids.RUN_STATUS, "data"): run_status,
    (ids.RUNS_TABLE, "cellClicked"): clicked_row, (ids.RUNS_TABLE, "selectedRows"): row_ids,
    (ids.TL_STEP, "value"): step, (ids.TL_FIND, "value"): text,
    (ids.TL_VIEW, "data"): timeline_view, (ids.TL_PICKED, "data"): picked_span,
    (ids.OPS_GROUP, "value"): group_by, (ids.OPS_TABLE, "cellClicked"): clicked_row,
    (ids.CMP_A, "value"): text, (ids.CMP_B, "value"): text, (ids.CMP_SHOWN, "data"): run_pair,
    (ids.TEN_TABLE, "cellClicked"): clicked_row,
    (ids.SQL_RUN, "n_clicks"): _whole_or_none, (ids.SQL_TEXT, "value"): text,
    (ids.FLAME_KIND, "value"): lambda v, n: choice(v, n, ("stacks", "ops")), (ids.FLAME_STEP, "value"): step,
    (ids.TL_AREA, "data"): lambda v, n: area(v, n),
}


def check_input(component: str, prop: str, value) -> None:
    """BadInput unless `value` is what (component, prop) holds. A server-side callback input with no schema is a
    bug of ours (a callback added without its line in SCHEMA): a 500 that says so, never an unchecked value."""
    check = SCHEMA.get((component, prop))
    if check is None:
        raise LookupError(f"{component}.{prop} has no schema in opscope.app.web.inputs.SCHEMA: add one")
    check(value, f"{component}.{prop}")


def check_request(body, name: str = "the request") -> None:
    """Every string (and key) in a JSON document is text of at most TEXT_MAX characters, nested at most
    DEPTH_MAX deep: whatever a callback then does with any part of it, no encoder or store chokes on it."""
    stack = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > DEPTH_MAX:
            raise BadInput(f"{name} is nested more than {DEPTH_MAX} deep")
        if isinstance(value, str):
            text(value, f"a string in {name}")
        elif isinstance(value, dict):
            for k, v in value.items():
                text(k, f"a key in {name}")
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
