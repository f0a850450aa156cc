"""Per-op aggregates, in SQL over the events table: count, total, self, mean, p50/p95, FLOP/s, share.

Self time is an event's duration minus its direct children's (depth + 1, same run, step and thread,
starting inside it). Graph-engine runs are flat (depth 0 everywhere) and skip the join; nested
runs (imported traces) find each child's parent with one ASOF join, which stays fast on millions.

A finished run's events no longer change, so its whole-run aggregates are computed once (when the
run finishes, or on the first query) into the table op_stats_cache and later queries read a few
rows instead of scanning every event. A cached result is used only while the run's event count
(runs.events) is the one it was computed from; a running run, or a query for one step, aggregates
live.
"""
from __future__ import annotations

_KEYS = {"op": "op", "module": "coalesce(nullif(module, ''), '(top)')", "node": "node"}
# the most frequent op of a group; grouped by op, that is the key itself (no second aggregate)
_OP = {"op": "op", "module": "mode(op)", "node": "mode(op)"}

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
    , agg AS (
        SELECT {key} AS key, {op} AS op, count(*) AS count, sum(dur)::BIGINT AS total_ns,
               sum(self_dur)::BIGINT AS self_ns, avg(dur) AS mean_ns,
               quantile_cont(dur, [0.5, 0.95]) AS q,
               sum(flops)::BIGINT AS flops, sum(bytes)::BIGINT AS bytes,
               CASE WHEN sum(dur) > 0 THEN sum(flops) / (sum(dur) / 1e9) ELSE 0 END AS achieved_flops,
               sum(dur) FILTER (WHERE depth = 0) / any_value(total.t) AS share,
               bool_or(fallback) AS fallback
        FROM ev, total
        GROUP BY {key}
    )
    SELECT key, op, count, total_ns, self_ns, mean_ns, q[1] AS p50_ns, q[2] AS p95_ns, flops, bytes,
           achieved_flops, share, fallback
    FROM agg
"""
_ORDER = " ORDER BY total_ns DESC, key"

STAT_KEYS = ["key", "op", "count", "total_ns", "self_ns", "mean_ns", "p50_ns", "p95_ns", "flops", "bytes",
             "achieved_flops", "share", "fallback"]

CACHE_DDL = """CREATE TABLE IF NOT EXISTS op_stats_cache (
    run_id TEXT, grouping TEXT, events BIGINT, rank INTEGER,      -- events: runs.events when computed
    key TEXT, op TEXT, count BIGINT, total_ns BIGINT, self_ns BIGINT, mean_ns DOUBLE, p50_ns DOUBLE,
    p95_ns DOUBLE, flops BIGINT, bytes BIGINT, achieved_flops DOUBLE, share DOUBLE, fallback BOOLEAN
)"""
_CACHED = f"SELECT {', '.join(STAT_KEYS)} FROM op_stats_cache WHERE run_id = $run AND grouping = $by ORDER BY rank"


def _check(by: str) -> None:
    if by not in _KEYS:
        from opscope.runtime.errors import UsageError
        raise UsageError(f"cannot group ops by {by!r}: use one of {', '.join(_KEYS)}")


def _live_sql(con, run_id: str, by: str, step_sql: str) -> str:
    nested = con.execute("SELECT coalesce(max(depth), 0) FROM events WHERE run_id = $run", {"run": run_id}).fetchone()[0]
    head = (_NESTED if nested else _FLAT).format(step=step_sql)
    return head + _AGG.format(key=_KEYS[by], op=_OP[by])


def _state(con, run_id: str):
    """(status, events) of the run, or None."""
    return con.execute("SELECT status, events FROM runs WHERE run_id = $run", {"run": run_id}).fetchone()


def op_stats(con, run_id: str, by: str = "op", step=None) -> list[dict]:
    _check(by)
    if step is not None:
        sql = _live_sql(con, run_id, by, "AND step = $step") + _ORDER
        rows = con.execute(sql, {"run": run_id, "step": int(step)}).fetchall()
        return [_dict(r) for r in rows]
    state = _state(con, run_id)
    if state is not None and state[0] != "running":
        rows = _cached(con, run_id, by, state[1])
        if rows is None:
            cache(con, run_id, [by], state[1])
            rows = _cached(con, run_id, by, state[1])
        if rows is not None:
            return [_dict(r) for r in rows]
    rows = con.execute(_live_sql(con, run_id, by, "") + _ORDER, {"run": run_id}).fetchall()
    return [_dict(r) for r in rows]


def _cached(con, run_id: str, by: str, events: int):
    head = con.execute("SELECT any_value(events), count(*) FROM op_stats_cache WHERE run_id = $run AND grouping = $by",
                       {"run": run_id, "by": by}).fetchone()
    if not head[1] or head[0] != events:
        return None
    return con.execute(_CACHED, {"run": run_id, "by": by}).fetchall()


def cache(con, run_id: str, bys=tuple(_KEYS), events: int | None = None) -> None:
    """Compute a finished run's whole-run aggregates once and keep them (replacing older ones)."""
    if events is None:
        state = _state(con, run_id)
        if state is None:
            return
        events = state[1]
    for by in bys:
        _check(by)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM op_stats_cache WHERE run_id = $run AND grouping = $by", {"run": run_id, "by": by})
            con.execute(f"""INSERT INTO op_stats_cache
                SELECT $run, $by, $events, row_number() OVER (ORDER BY total_ns DESC, key), *
                FROM ({_live_sql(con, run_id, by, '')})""", {"run": run_id, "by": by, "events": int(events)})
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


def _dict(r) -> dict:
    d = dict(zip(STAT_KEYS, r))
    d["share"] = float(d["share"] or 0.0)
    d["fallback"] = bool(d["fallback"])
    for k in ("flops", "bytes", "total_ns", "self_ns"):
        d[k] = int(d[k] or 0)
    return d
