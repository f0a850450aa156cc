"""How far a run's outputs are from the expected ones: max abs / max rel error and cosine similarity.

Its own module (numpy only) because the region value check reads it while the backends are being built:
kept in session.py, it pulled the whole runtime into one import cycle. session re-exports it.
"""
from __future__ import annotations

import numpy as np

REL_FLOOR = 1e-6
REL_BASIS = f"per element, |actual - expected| / max(|expected|, {REL_FLOOR:g}): large where expected is near 0"


def compare(actual: list, expected: list) -> dict:
    """max abs / max rel error and cosine similarity over all outputs (float64).

    max_rel is per element over REL_BASIS (rel_basis in the result says so, for reports). A value
    that is NaN on one side only, or outputs with nothing finite to compare, make the errors NaN:
    "0.00e+00" for an all-NaN output would read as a perfect match. `note` says why.
    """
    with np.errstate(all="ignore"):      # NaN and inf are reported, not warned about
        return _compare(actual, expected)


def _compare(actual: list, expected: list) -> dict:
    max_abs = max_rel = 0.0
    dot = na = nb = 0.0
    compared = 0
    notes = []
    for a, e in zip(actual, expected):
        a = np.asarray(a, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        if a.shape != e.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine": 0.0, "rel_basis": REL_BASIS,
                    "note": f"shape {a.shape} != {e.shape}"}
        if a.size == 0:
            continue
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        one_sided = int(np.count_nonzero(nan_a != nan_e))
        if one_sided:
            notes.append(f"{one_sided} value(s) NaN on one side only")
        same = (a == e) | (nan_a & nan_e)          # equal infinities and NaN on both sides agree
        d = np.abs(a - e)
        d = np.where(same, 0.0, d)
        if np.isnan(d).any():                      # one-sided NaN, inf against a finite value
            max_abs = max_rel = float("nan")
        elif not np.isnan(max_abs):
            max_abs = max(max_abs, float(np.max(d)))
            max_rel = max(max_rel, float(np.max(d / np.maximum(np.abs(e), REL_FLOOR))))
        compared += int(np.count_nonzero(~(nan_a & nan_e)))
        finite = np.isfinite(a) & np.isfinite(e)          # the cosine is of the values both sides have
        fa, fe = np.where(finite, a, 0.0).ravel(), np.where(finite, e, 0.0).ravel()
        dot += float(fa @ fe)
        na += float(fa @ fa)
        nb += float(fe @ fe)
    if not compared and any(np.asarray(a).size for a in actual):
        max_abs = max_rel = float("nan")
        notes.append("every output value is NaN: nothing to compare")
    cos = dot / (np.sqrt(na) * np.sqrt(nb)) if na > 0 and nb > 0 else 1.0
    if np.isnan(max_abs):
        cos = float("nan")
    out = {"max_abs": max_abs, "max_rel": max_rel, "cosine": float(cos), "rel_basis": REL_BASIS}
    if notes:
        out["note"] = "; ".join(notes)
    return out
