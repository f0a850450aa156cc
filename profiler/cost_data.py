"""What the learned cost model (runtime/cost_model.py) learns from: measured ops and regions in the run
store, one row per (run, node) with the least of its steps after the first (the first pays compilation
and caches), and per region its measured time with the ops a stack ran inside it.

The least, not the median: the events are wall-clock spans, and a loaded machine only ever adds to them
(at load 27 one linear measured 25 us and 34 ms in two steps); the least of a few steps is the op's own
cost, which is what a model can learn from its features and what a placement on a quiet machine meets.

Only finished graph runs count (engine graph, status ok); imported traces have no opscope op names.
Rows are bounded per run (MAX_ROWS_PER_RUN) so a million-event run cannot fill memory.
"""
from __future__ import annotations

import json
from collections import defaultdict

from opscope.runtime.cost_model import CostModel, OpRow, spearman

from .store import RunStore

MAX_ROWS_PER_RUN = 200_000
MAX_STEPS = 20


def _numel(shapes_json: str | None) -> float:
    try:
        shapes = json.loads(shapes_json or "[]")
    except ValueError:
        return 0.0
    total = 0.0
    for s in shapes if isinstance(shapes, list) else []:
        if isinstance(s, list) and all(isinstance(d, int) for d in s):
            n = 1.0
            for d in s:
                n *= d
            total += n
    return total


def _dtype(dtypes_json: str | None) -> str:
    try:
        d = json.loads(dtypes_json or "[]")
        return str(d[0]) if isinstance(d, list) and d else "float32"
    except ValueError:
        return "float32"


def collect(store: RunStore | None = None, runs: list[str] | None = None):
    """(op rows, region tuples) from the store: regions as (backend, measured ns, [its op rows], model)."""
    store = store or RunStore()
    with store.connect(read_only=True) as con:
        chosen = con.execute("SELECT run_id, model FROM runs WHERE status = 'ok' AND engine = 'graph'"
                             + (" AND run_id IN (SELECT unnest(?))" if runs else "") + " ORDER BY started_at",
                             [runs] if runs else []).fetchall()
        ops: list[OpRow] = []
        regions: list[tuple] = []
        for run_id, model in chosen:
            events = con.execute(
                "SELECT step, seq, op, node, backend, depth, end_ns - start_ns, flops, bytes, input_shapes, "
                "output_shapes, input_dtypes, phase FROM events WHERE run_id = ? AND step >= "
                "(SELECT CASE WHEN max(step) > 0 THEN 1 ELSE 0 END FROM events WHERE run_id = ?) AND step < ? "
                "ORDER BY step, seq LIMIT ?", [run_id, run_id, MAX_STEPS, MAX_ROWS_PER_RUN]).fetchall()
            o, r = _rows(events, model or run_id)
            ops += o
            regions += r
    return ops, regions


def _rows(events, model: str):
    times: dict[tuple, list[float]] = defaultdict(list)
    first: dict[tuple, OpRow] = {}
    region_times: dict[tuple, list[float]] = defaultdict(list)
    region_ops: dict[tuple, list[tuple]] = {}
    previous, open_region, seen_in_step = "", None, defaultdict(int)
    for step, _seq, op, node, backend, depth, dur, flops, nbytes, ins, outs, dtypes, phase in events:
        if op == "region":
            open_region = (node, backend, phase)
            region_times[open_region].append(float(dur))
            region_ops.setdefault(open_region, [])
            continue
        if depth == 0:
            open_region = None
        # a node can run more than once in a step (a loop): count each run apart
        nth = seen_in_step[(step, node, phase)]
        seen_in_step[(step, node, phase)] += 1
        key = (node, phase, backend, nth)
        times[key].append(float(dur))
        if key not in first:
            first[key] = OpRow(op, backend or "", float(flops or 0), float(nbytes or 0), _numel(outs), _numel(ins),
                               _dtype(dtypes), previous, None, model)
            if open_region is not None and depth >= 1:
                region_ops[open_region].append(key)
        previous = op
    ops = []
    for key, row in first.items():
        row.time_ns = min(times[key])
        ops.append(row)
    regions = [(k[1], min(region_times[k]), [first[o] for o in region_ops[k]], model)
               for k in region_times if region_ops.get(k)]
    return ops, regions


def _num(v: float) -> float | None:
    """JSON has no NaN: too few pairs to rank reads as null."""
    return None if v != v else round(v, 4)


def fit(ops, regions, **kw) -> CostModel:
    return CostModel.fit(ops, [(b, t, o) for b, t, o, _ in regions], **kw)


def _naive(rows) -> list[float]:
    """The ranking that needs no training: an op's work, FLOPs + bytes (the cost model must beat it)."""
    return [r.flops + r.bytes for r in rows]


def check(ops, regions, **kw) -> dict:
    """Accuracy on models the model was not trained on: for each model, train on the others and rank-correlate
    predicted with measured times of its ops and its regions (Spearman), per model, per backend and pooled,
    each beside the naive ranking by FLOPs + bytes on the same rows."""
    models = sorted({r.model for r in ops})
    if len(models) < 2:
        from opscope.runtime.errors import UsageError
        raise UsageError(f"the run store holds measured ops of {len(models)} model(s); a check leaves one model "
                         "out, so it needs runs of at least 2 (profile more models, e.g. `opscope profile demo:cnn`)")
    per_model, held_ops, held_pred, all_regions = [], [], [], ([], [], [])
    for held in models:
        train = [r for r in ops if r.model != held]
        test = [r for r in ops if r.model == held]
        m = CostModel.fit(train, [(b, t, o) for b, t, o, mm in regions if mm != held], **kw)
        known = [r for r in test if r.backend in m.backends]
        pred = m.predict(known)
        meas = [r.time_ns for r in known]
        rp, rm, rn = [], [], []
        for b, t, o, mm in regions:
            if mm == held:
                p = m.predict_region(b, o)
                if p is not None:
                    rp.append(p)
                    rm.append(t)
                    rn.append(sum(_naive(o)))
        per_model.append({"model": held, "ops": len(known), "op_spearman": _num(spearman(pred, meas)),
                          "naive_op_spearman": _num(spearman(_naive(known), meas)),
                          "regions": len(rp), "region_spearman": _num(spearman(rp, rm))})
        held_ops.extend(known)
        held_pred.extend(pred)
        for into, values in zip(all_regions, (rp, rm, rn)):
            into.extend(values)
    meas = [r.time_ns for r in held_ops]
    per_backend = []
    for b in sorted({r.backend for r in held_ops}):
        idx = [i for i, r in enumerate(held_ops) if r.backend == b]
        per_backend.append({"backend": b, "ops": len(idx),
                            "op_spearman": _num(spearman([held_pred[i] for i in idx], [meas[i] for i in idx])),
                            "naive_op_spearman": _num(spearman(_naive([held_ops[i] for i in idx]),
                                                               [meas[i] for i in idx]))})
    return {"models": per_model, "backends": per_backend, "op_spearman": _num(spearman(held_pred, meas)),
            "naive_op_spearman": _num(spearman(_naive(held_ops), meas)), "ops": len(held_ops),
            "region_spearman": _num(spearman(all_regions[0], all_regions[1])),
            "naive_region_spearman": _num(spearman(all_regions[2], all_regions[1])), "regions": len(all_regions[0]),
            "note": "held-out: each model's times are predicted by a model trained on the other models' runs; "
                    "naive: ranked by FLOPs + bytes, no training"}
