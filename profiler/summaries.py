"""Tensor-value summaries (behind --values: they read every output back to the host)."""
from __future__ import annotations

import json

import numpy as np

BINS = 16


def summarize(arr) -> tuple | None:
    """(shape, dtype, count, min, max, mean, std, nan, inf, hist, hist_lo, hist_hi) of one value, or None."""
    a = np.asarray(arr)
    if a.dtype == object:
        return None
    shape = json.dumps(list(a.shape))
    dtype = str(a.dtype)
    count = int(a.size)
    if count == 0:
        return shape, dtype, 0, None, None, None, None, 0, 0, "[]", None, None
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    if a.dtype.kind == "f":
        nan_mask = np.isnan(a)
        inf_mask = np.isinf(a)
        nan, inf = int(nan_mask.sum()), int(inf_mask.sum())
        finite = a[~(nan_mask | inf_mask)] if nan or inf else a
    else:
        nan = inf = 0
        finite = a
    if finite.size == 0:
        return shape, dtype, count, None, None, None, None, nan, inf, "[]", None, None
    f = finite.astype(np.float64, copy=False).ravel()
    lo, hi = float(f.min()), float(f.max())
    hist, _ = np.histogram(f, bins=BINS, range=(lo, hi if hi > lo else lo + 1.0))
    return (shape, dtype, count, lo, hi, float(f.mean()), float(f.std()), nan, inf, json.dumps(hist.tolist()),
            lo, hi)
