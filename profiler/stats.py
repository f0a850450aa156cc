"""Per-op aggregates, in SQL over the events table: count, total, self, mean, p50/p95, FLOP/s, share.

Self time is an event's duration minus its direct children's (depth + 1, same run, step and thread,
starting inside it). Graph-engine runs are flat (depth 0 everywhere) and skip the join; nested
runs (imported traces) find each child's parent with one ASOF join, which stays fast on millions.
"""
from __future__ import annotations

_KEYS = {"op": "op", "module": "coalesce(nullif(module, ''), '(top)')", "node": "node"}

_FLAT = """
    WITH ev AS (
        SELECT op, node, module, end_ns - start_ns AS dur, end_ns - start_ns AS self_dur, flops, bytes, fallback, depth
        FROM events WHERE run_id = $run {step}
    )"""

_NESTED = """
    WITH base AS (
        SELECT row_number() OVER () AS id, step, thread, depth, start_ns, end_ns, op, node, module, flops, bytes,
               fallback, end_ns - start_ns AS dur
        FROM events WHERE run_id = $run {step}
    ), parent AS (
        SELECT c.id AS child, p.id AS pid, c.dur AS cdur, c.end_ns AS c_end, p.end_ns AS p_end
        FROM base c ASOF JOIN base p
          ON c.step = p.step AND c.thread = p.thread AND c.depth = p.depth + 1 AND c.start_ns >= p.start_ns
    ), child_time AS (
        SELECT pid, sum(cdur) AS kids FROM parent WHERE c_end <= p_end GROUP BY pid
    ), ev AS (
        SELECT b.op, b.node, b.module, b.dur, greatest(b.dur - coalesce(k.kids, 0), 0) AS self_dur, b.flops, b.bytes,
               b.fallback, b.depth
        FROM base b LEFT JOIN child_time k ON k.pid = b.id
    )"""

_AGG = """
    , total AS (SELECT greatest(sum(dur) FILTER (WHERE depth = 0), 1) AS t FROM ev)
    SELECT {key} AS key, mode(op) AS op, count(*) AS count, sum(dur)::BIGINT AS total_ns,
           sum(self_dur)::BIGINT AS self_ns, avg(dur) AS mean_ns,
           quantile_cont(dur, 0.5) AS p50_ns, quantile_cont(dur, 0.95) AS p95_ns,
           sum(flops)::BIGINT AS flops, sum(bytes)::BIGINT AS bytes,
           CASE WHEN sum(dur) > 0 THEN sum(flops) / (sum(dur) / 1e9) ELSE 0 END AS achieved_flops,
           sum(dur) FILTER (WHERE depth = 0) / any_value(total.t) AS share,
           bool_or(fallback) AS fallback
    FROM ev, total
    GROUP BY {key}
    ORDER BY total_ns DESC, key
"""

STAT_KEYS = ["key", "op", "count", "total_ns", "self_ns", "mean_ns", "p50_ns", "p95_ns", "flops", "bytes",
             "achieved_flops", "share", "fallback"]


def op_stats(con, run_id: str, by: str = "op", step=None) -> list[dict]:
    if by not in _KEYS:
        from opscope.runtime.errors import UsageError
        raise UsageError(f"cannot group ops by {by!r}: use one of {', '.join(_KEYS)}")
    params = {"run": run_id}
    step_sql = ""
    if step is not None:
        step_sql = "AND step = $step"
        params["step"] = int(step)
    nested = con.execute("SELECT coalesce(max(depth), 0) FROM events WHERE run_id = $run", {"run": run_id}).fetchone()[0]
    head = (_NESTED if nested else _FLAT).format(step=step_sql)
    rows = con.execute(head + _AGG.format(key=_KEYS[by]), params).fetchall()
    out = []
    for r in rows:
        d = dict(zip(STAT_KEYS, r))
        d["share"] = float(d["share"] or 0.0)
        d["fallback"] = bool(d["fallback"])
        for k in ("flops", "bytes", "total_ns", "self_ns"):
            d[k] = int(d[k] or 0)
        out.append(d)
    return out
