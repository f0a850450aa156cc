"""Searches remembered under $OPSCOPE_HOME/autoplace/KEY.json, so `profile`, `train`, `debug` and `run` with
`-b auto` on a graph searched before (same ops and shapes, candidates, versions, threads) do not search again.
A file that does not read back as a choice is ignored (searched again and rewritten), never trusted further
than a plan's choice: it names backends and node ranges, nothing that runs."""
from __future__ import annotations

import json
import os

from ..errors import UsageError
from ..home import opscope_home
from ..safe_read import read_small_json

MAX_BYTES = 16 << 20


def _path(key: str):
    return opscope_home() / "autoplace" / f"{key}.json"


def load(key: str, reg):
    from .choice import Choice
    path = _path(key)
    doc = read_small_json(path, MAX_BYTES)        # missing, too big, too deep or not JSON: never written
    try:
        choice = Choice.from_doc(doc, str(path))
    except UsageError:
        return None
    if {s.backend for s in choice.segments} - set(reg.backends):
        return None
    choice.source = "cache"
    return choice


def save(key: str, choice) -> None:
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(choice.to_doc(), allow_nan=False))
        os.replace(tmp, path)
    except (OSError, ValueError):        # a read-only home: the search is simply not remembered
        pass
