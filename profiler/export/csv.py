"""Per-op aggregates as CSV (store.op_stats): one row per op, module or node, for spreadsheets."""
from __future__ import annotations

import csv
import io

from opscope.profiler.stats import STAT_KEYS

from . import open_output


def write_csv(store, run_id: str, path, gzip: bool = False, by: str = "name") -> dict:
    """by "name" (the default): an imported trace's ops as the trace names them (`aten::mm`)."""
    run = store.get_run(run_id)
    rows = store.op_stats(run["run_id"], by=by)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=STAT_KEYS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in STAT_KEYS})
    data = buf.getvalue().encode()
    with open_output(path, gzip) as f:
        f.write(data)
    return {"run_id": run["run_id"], "rows": len(rows), "by": by}
