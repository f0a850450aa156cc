"""The tuning cache: the best configuration `opscope tune` found, keyed by everything that could
make it wrong -- the backend description, the software versions, the graph's ops and shapes, and
the dtype -- so a second call reuses it and a changed description or library invalidates it.

One JSON file, $OPSCOPE_HOME/tuning/cache.json: {key: entry}. Small, human-readable, and a user
can delete it to start over.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from opscope.runtime.errors import UsageError
from opscope.runtime.home import HOME_ENV, opscope_home


def cache_path() -> Path:
    return opscope_home() / "tuning" / "cache.json"


def software_versions() -> dict:
    import numpy
    import torch
    from importlib.metadata import PackageNotFoundError, version
    try:
        ours = version("opscope")
    except PackageNotFoundError:
        ours = "0+unknown"
    return {"torch": torch.__version__, "numpy": numpy.__version__, "opscope": ours}


def description_hash(desc) -> str:
    """Of the parsed description (digest included): an edited file is a different chip."""
    return hashlib.sha256(json.dumps(desc.as_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def graph_signature(graph) -> str:
    """The ops, their shapes and dtypes, in order: a different model or input shape is a different problem."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(n.op.encode())
        for m in list(n.input_meta) + list(n.output_meta):
            if m is not None:
                h.update(f"{m.shape}{m.dtype}".encode())
    return h.hexdigest()[:16]


def cache_key(desc, graph, dtype: str, versions: dict | None = None) -> tuple[str, dict]:
    parts = {"description": description_hash(desc), "versions": versions or software_versions(),
             "graph": graph_signature(graph), "dtype": dtype}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20], parts


def _read() -> dict:
    p = cache_path()
    try:
        if not p.is_file():
            return {}
    except OSError:
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}          # a damaged cache only costs a re-measurement
    return data if isinstance(data, dict) else {}


def get(key: str) -> dict | None:
    entry = _read().get(key)
    return entry if isinstance(entry, dict) and {"default", "best", "speedup"} <= entry.keys() else None


def put(key: str, entry: dict) -> None:
    data = _read()
    data[key] = entry
    p = cache_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # write-then-rename: two tuners finishing together never leave half a file
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".cache-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
        os.replace(tmp, p)
    except OSError as e:               # OPSCOPE_HOME is a file, read-only, or cannot be created
        raise UsageError(f"cannot write the tuning cache at {p}: {e.strerror or e}; set {HOME_ENV} to a writable "
                         "folder") from None
