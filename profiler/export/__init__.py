"""Trace export: a run as Chrome trace JSON, Perfetto protobuf, or a CSV of per-op aggregates.

    from opscope.profiler.export import export
    export(store, run_id, "chrome", "run.json.gz", gzip=True)
"""
from __future__ import annotations

import gzip as gzip_module
from pathlib import Path

from opscope.runtime.errors import UsageError

FORMATS = ("chrome", "perfetto", "csv")
# what a file name says about its format, when --format is not given
_SUFFIXES = {".json": "chrome", ".pftrace": "perfetto", ".perfetto-trace": "perfetto", ".pb": "perfetto",
             ".csv": "csv"}


def guess_format(path) -> str | None:
    p = Path(str(path))
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def open_output(path, gzip: bool):
    """The file a writer writes to: gzipped when asked, else plain with a big buffer."""
    return gzip_module.open(path, "wb", compresslevel=3) if gzip else open(path, "wb", buffering=1 << 20)


def export(store, run_id: str, fmt: str, path, gzip: bool = False, by: str = "name") -> dict:
    """Write run `run_id` to `path` in `fmt`; returns a small report (counts, path, bytes)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown trace format {fmt!r}: use one of {', '.join(FORMATS)}")
    path = Path(path)
    if not path.parent.exists():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder, give a file name")
    try:
        if fmt == "chrome":
            from .chrome import write_chrome
            report = write_chrome(store, run_id, path, gzip=gzip)
        elif fmt == "perfetto":
            from .perfetto import write_perfetto
            report = write_perfetto(store, run_id, path, gzip=gzip)
        else:
            from .csv import write_csv
            report = write_csv(store, run_id, path, gzip=gzip, by=by)
    except OSError as e:          # no permission, a read-only or full disk: the user's to fix
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    report.update(format=fmt, path=str(path), gzip=gzip, bytes=path.stat().st_size)
    return report
