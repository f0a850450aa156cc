"""The hook for a learned cost model: a region's time on a stack predicted instead of measured.

    seconds = predict("onnxruntime", regions)     # None: no model, or it cannot say -> the search measures

A cost model lives in runtime/cost_model.py and defines `predict(stack: str, regions: list[Region]) -> float |
None` (seconds for one call of each region, summed). The search asks it for every candidate but the stacks'
whole-graph baselines; what it predicts is measured before it is chosen, so a wrong prediction costs a
measurement, never a wrong placement.
"""
from __future__ import annotations


def predict(stack: str, regions: list) -> float | None:
    try:
        from .. import cost_model
    except ImportError:
        return None
    f = getattr(cost_model, "predict", None)
    if f is None:
        return None
    try:
        seconds = f(stack, regions)
    except Exception:          # a model that cannot answer is a model that did not predict
        return None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else None
