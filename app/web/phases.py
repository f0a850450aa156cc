"""What the pages show of a training run: time per phase, forward against backward per module, and memory
by category over time (runs.config["train"]["memory_timeline"], one training step's plan, seq by seq).

    phase_rows(data, run)        # [{phase, kind, count, total_ns, ...}] for the Operators page's "phase" grouping
    module_phases(data, run)     # [{module, forward_ns, backward_ns, ratio}]: a backward op counts for the
                                 # module of the forward op it differentiates (its fwd_node)
    memory_categories(data, run) # {"t", per category bytes, "peak"} on the timeline's axis, or None
"""
from __future__ import annotations

import numpy as np

from opscope.profiler import stats

CATEGORIES = ("parameter", "optimizer_state", "input", "gradient", "activation", "temporary")
CATEGORY_COLORS = {"parameter": "#2563eb", "optimizer_state": "#7c3aed", "input": "#94a3b8",
                   "gradient": "#dc2626", "activation": "#059669", "temporary": "#f59e0b"}


def is_training(data, run: dict) -> bool:
    return bool(data.store.query("SELECT 1 FROM events WHERE run_id = ? AND phase IN ('backward', 'optimizer') "
                                 "LIMIT 1", [run["run_id"]]))


def phase_rows(data, run: dict) -> list[dict]:
    """One row per phase and kind of track, shaped as stats.op_breakdown's rows (key: the phase).

    A phase's total is its ops' time at the top level of their lanes, so a nested op is not counted twice;
    self is the same (a phase has no parent); shares are of the kind's busy time."""
    times = data.times(run)
    busy = {"host": times["host_ns"], "device": times["device_ns"]}
    rows = data.store.query(
        f"""SELECT coalesce(nullif(phase, ''), 'forward') AS p, {stats.kind_sql()} AS kind, count(*),
                   sum(end_ns - start_ns) FILTER (WHERE {stats.lane_depth_sql()} = 0),
                   avg(end_ns - start_ns), quantile_cont(end_ns - start_ns, 0.95), sum(flops), sum(bytes),
                   mode(op), bool_or(fallback)
            FROM events WHERE run_id = ? GROUP BY ALL ORDER BY 4 DESC""", [run["run_id"]])
    out = []
    for phase, kind, count, total, mean, p95, flops, nbytes, op, fallback in rows:
        total = int(total or 0)
        b = busy.get(kind) or 0
        out.append({"key": phase, "kind": kind, "op": op, "count": int(count), "total_ns": total, "self_ns": total,
                    "mean_ns": mean, "p50_ns": None, "p95_ns": p95, "flops": int(flops or 0),
                    "bytes": int(nbytes or 0), "achieved_flops": (flops or 0) / (total / 1e9) if total else 0.0,
                    "fallback": bool(fallback), "depth": 0,
                    "total_pct": 100.0 * total / b if b else None, "self_pct": 100.0 * total / b if b else None})
    return out


def module_phases(data, run: dict, limit: int = 40) -> list[dict]:
    """Per module: forward and backward time (top-level ops only), the backward's from its fwd_node's module."""
    with data.store.connect(read_only=True) as con:
        rows = con.execute(
            f"""WITH fwd AS (SELECT step, node, any_value(module) AS module FROM events
                             WHERE run_id = $r AND phase = 'forward' GROUP BY step, node),
                     ev AS (SELECT e.phase, e.end_ns - e.start_ns AS dur,
                                   CASE WHEN e.phase = 'backward' THEN f.module ELSE e.module END AS module
                            FROM events e LEFT JOIN fwd f ON e.phase = 'backward' AND f.step = e.step
                                                          AND f.node = e.fwd_node
                            WHERE e.run_id = $r AND e.phase IN ('forward', 'backward')
                              AND {stats.lane_depth_sql("e.")} = 0)
                SELECT coalesce(nullif(module, ''), '(top level)') AS m,
                       coalesce(sum(dur) FILTER (WHERE phase = 'forward'), 0),
                       coalesce(sum(dur) FILTER (WHERE phase = 'backward'), 0)
                FROM ev GROUP BY m ORDER BY sum(dur) DESC, m LIMIT $n""",
            {"r": run["run_id"], "n": int(limit)}).fetchall()
    return [{"module": m, "forward_ns": int(f), "backward_ns": int(b), "ratio": (b / f) if f else None}
            for m, f, b in rows]


def memory_categories(data, run: dict) -> dict | None:
    """The training step's memory by category, repeated for every recorded step on the timeline's axis:
    each sample at the start of the op (seq) after which it holds. None for a run without the timeline."""
    tl = ((run.get("config") or {}).get("train") or {}).get("memory_timeline") or {}
    if not tl.get("seq"):
        return None
    seqs = np.asarray(tl["seq"], np.int64)
    rows = data.store.query("SELECT step, seq, start_ns FROM events WHERE run_id = ? AND seq <= ? ORDER BY step, seq",
                            [run["run_id"], int(seqs.max())])
    shifts = data.step_shifts(run)
    by_step: dict[int, dict[int, int]] = {}
    for step, seq, t in rows:
        by_step.setdefault(step, {})[seq] = t - shifts.get(step, 0)
    t_all, cats = [], {c: [] for c in CATEGORIES}
    for step in sorted(by_step):
        at = by_step[step]
        keep = [i for i, s in enumerate(tl["seq"]) if s in at]
        t_all += [at[tl["seq"][i]] for i in keep]
        for c in CATEGORIES:
            cats[c] += [tl.get(c, [0] * len(seqs))[i] for i in keep]
    if not t_all:
        return None
    peak = dict(tl.get("peak") or {})
    first = min(by_step)
    peak_seq = peak.get("seq")
    peak["t"] = by_step[first].get(peak_seq) if peak_seq is not None else None
    peak["step"] = first
    hit = data.store.query("SELECT op, module FROM events WHERE run_id = ? AND step = ? AND seq = ? LIMIT 1",
                           [run["run_id"], first, peak_seq]) if peak_seq is not None else []
    peak["op"], peak["module"] = hit[0] if hit else (None, None)
    return {"t": t_all, **cats, "peak": peak, "steps": len(by_step)}
