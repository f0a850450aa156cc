"""Per-op aggregates, in SQL over the events table: count, total, self, mean, p50/p95, FLOP/s, share.

Self time is an event's duration minus its direct children's (depth + 1, same run, step and thread,
starting inside it). Ops on a device stream (kernels, copies) never nest: one stream runs one kernel
at a time, so a kernel that overlaps the previous one by a rounding nanosecond is still top level.

Time of a run (`run_times`) is the union of its top-level spans, per kind of track: host (CPU
threads) and device (GPU streams, a simulated chip). Host and device time are never added, and a
nested op's time is never counted twice. Graph-engine runs are flat (depth 0 everywhere) and skip the join; nested
runs (imported traces) find each child's parent with one ASOF join, which stays fast on millions.

A finished run's events no longer change, so its whole-run aggregates are computed once (when the
run finishes, or on the first query) into the table op_stats_cache and later queries read a few
rows instead of scanning every event. A cached result is used only while the run's event count
(runs.events) is the one it was computed from; a running run, or a query for one step, aggregates
live.
"""
from __future__ import annotations

import re

from opscope.runtime import registry

# What a track is: a device (GPU stream, simulated chip) or the host (CPU threads). A host-timed backend's events
# (registry clock "host": `onnxruntime:CPUExecutionProvider`, `openvino:CPU`, `xla:cuda`, a vendor's `acme:NPU`)
# are host calls opscope timed, the stack run synchronously inside them, with the stack's own per-op spans
# nested beneath a region (depth 1). The registry is light (no torch): its names, not a copy of them.
HOST_TIMED = tuple(sorted(n for n in registry.host_timed() if re.fullmatch(r"[A-Za-z0-9_-]+", n)))
KIND_SQL = ("CASE WHEN coalesce({t}device, '') = '' OR split_part({t}device, ':', 1) IN ('cpu', "
            + ", ".join(f"'{x}'" for x in HOST_TIMED) + ") THEN 'host' ELSE 'device' END")


def lane_depth_sql(t: str = "") -> str:
    """An event's nesting depth as drawn and aggregated: 0 for every op on a device stream."""
    from opscope.profiler.importers.kineto import DEVICE_OPS
    device_ops = ", ".join(f"'{x}'" for x in sorted(DEVICE_OPS))
    return f"CASE WHEN {t}op IN ({device_ops}) THEN 0 ELSE coalesce({t}depth, 0) END"


def kind_sql(t: str = "") -> str:
    return KIND_SQL.format(t=t)


# "name": as the trace names it (`aten::mm`, a kernel's name) for an imported run, whose node is that name; for
# opscope's own runs the op. "op": opscope's op vocabulary, a grouping a user switches to.
_KEYS = {"name": "op", "op": "op", "module": "coalesce(nullif(module, ''), '(top)')", "node": "node"}
_IMPORTED_NAME = "coalesce(nullif(node, ''), op)"
# HTA's kernel categories (compute, communication, memory copy / set); host ops apart
# a collective is communication on any track (a rank's c10d ops and its DDP buckets run on CPU threads; filed
# under "host" they hid every byte a CPU job sends)
CATEGORY_SQL = ("CASE WHEN phase = 'communication' OR starts_with(op, 'c10d:') OR lower(coalesce(node, '')) SIMILAR TO "
                "'.*(nccl|rccl|hccl|allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter|alltoall|"
                "broadcast|sendrecv).*' THEN 'communication' "
                "WHEN " + KIND_SQL.format(t="") + " = 'host' THEN 'host' "
                "WHEN op = 'memcpy' THEN 'memory copy' WHEN op = 'memset' THEN 'memory set' ELSE 'compute' END")
_KEYS["category"] = CATEGORY_SQL
# the most frequent op of a group; grouped by op, that is the key itself (no second aggregate)
_OP = {"name": "mode(op)", "op": "any_value(op)", "module": "mode(op)", "node": "mode(op)", "category": "mode(op)"}

_FLAT = """
    WITH raw AS (
        SELECT op, node, module, step, coalesce(rank, 0) AS rank, thread, start_ns, end_ns, end_ns - start_ns AS dur,
               flops, bytes, fallback, {depth} AS depth, {kind} AS kind, {key} AS gkey
        FROM events WHERE run_id = $run {step}
    ), ev AS (
        SELECT *, CASE WHEN kind = 'device' THEN incl ELSE dur END AS self_dur FROM (
            SELECT op, node, module, dur, flops, bytes, fallback, depth, kind, gkey,
                   greatest(end_ns - greatest(start_ns, coalesce(max(end_ns) OVER (
                       PARTITION BY gkey, rank, step, kind ORDER BY start_ns, end_ns DESC
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)), 0) AS incl,
                   true AS is_outer
            FROM raw)
    )"""

_NESTED = """
    WITH base AS (
        SELECT row_number() OVER () AS id, step, coalesce(rank, 0) AS rank, thread, {depth} AS depth, start_ns, end_ns, op, node, module,
               flops, bytes, fallback, end_ns - start_ns AS dur, {kind} AS kind, {key} AS gkey
        FROM events WHERE run_id = $run {step}
    ), parent AS (
        SELECT c.id AS child, p.id AS pid, c.dur AS cdur, c.end_ns AS c_end, p.end_ns AS p_end
        FROM base c ASOF JOIN base p
          ON c.rank = p.rank AND c.step = p.step AND c.thread = p.thread AND c.depth = p.depth + 1 AND c.start_ns >= p.start_ns
    ), child_time AS (
        SELECT pid, sum(cdur) AS kids FROM parent WHERE c_end <= p_end GROUP BY pid
    ), grouped AS (
        SELECT b.*, greatest(b.dur - coalesce(k.kids, 0), 0) AS self_dur, k.kids IS NOT NULL AS has_kids,
               max(b.end_ns) OVER (PARTITION BY b.gkey, b.rank, b.step, b.thread ORDER BY b.start_ns, b.end_ns DESC, b.id
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach,
               max(b.end_ns) OVER (PARTITION BY b.gkey, b.rank, b.step, b.kind ORDER BY b.start_ns, b.end_ns DESC, b.id
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach_kind
        FROM base b LEFT JOIN child_time k ON k.pid = b.id
    ), ev AS (
        SELECT op, node, module, dur, flops, bytes, fallback, depth, kind, gkey,
               greatest(end_ns - greatest(start_ns, coalesce(reach_kind, start_ns)), 0) AS incl,
               -- a kernel's self time is the time its group was running: streams overlap. A span with spans
               -- nested in it (a region and its stack's per-op children, on any track, whoever wrote the stack)
               -- keeps only what its children leave: each op's time is counted once
               CASE WHEN kind = 'device' AND NOT has_kids
                    THEN greatest(end_ns - greatest(start_ns, coalesce(reach_kind, start_ns)), 0)
                    ELSE self_dur END AS self_dur,
               reach IS NULL OR reach < end_ns AS is_outer
        FROM grouped
    )"""

_AGG = """
    , total AS (SELECT greatest(sum(dur) FILTER (WHERE depth = 0), 1) AS t FROM ev)
    , agg AS (
        SELECT {key} AS key, {op} AS op, count(*) FILTER (WHERE is_outer) AS count, sum(incl)::BIGINT AS total_ns,
               -- self <= total: spans of one group that overlap on one thread (a rank's async collectives)
               -- each keep their own self time, their total counts the overlap once
               least(sum(self_dur), sum(incl))::BIGINT AS self_ns, avg(dur) FILTER (WHERE is_outer) AS mean_ns,
               quantile_cont(dur, [0.5, 0.95]) FILTER (WHERE is_outer) AS q,
               (sum(flops) FILTER (WHERE is_outer))::BIGINT AS flops, (sum(bytes) FILTER (WHERE is_outer))::BIGINT AS bytes,
               CASE WHEN sum(incl) > 0 THEN coalesce(sum(flops) FILTER (WHERE is_outer), 0) / (sum(incl) / 1e9)
                    ELSE 0 END AS achieved_flops,
               least(sum(self_dur), sum(incl)) / any_value(total.t) AS share,
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


def key_sql(con, run_id: str, by: str) -> str:
    """The SQL of grouping `by` for this run: "name" is the trace's own name on an imported run."""
    _check(by)
    if by == "name":
        row = con.execute("SELECT engine FROM runs WHERE run_id = $run", {"run": run_id}).fetchone()
        return _IMPORTED_NAME if row and row[0] == "import" else "op"
    return _KEYS[by]


def _head(con, run_id: str, step_sql: str, key: str = "op") -> str:
    """The `ev` CTE: one row per event with its duration, self time, lane depth and kind, and, per grouping
    `key`, `incl` (its time not already covered by an earlier event of the same group on its kind of track: a
    group's total is the time it was running, so kernels of one name on overlapping streams count their overlap
    once and no share passes 100 %) and `is_outer`
    (not nested in one): `aten::matmul` around `aten::mm` grouped as one `matmul` counts the inner time and
    call once."""
    nested = con.execute(f"SELECT coalesce(max({lane_depth_sql()}), 0) FROM events WHERE run_id = $run",
                         {"run": run_id}).fetchone()[0]
    return (_NESTED if nested else _FLAT).format(step=step_sql, depth=lane_depth_sql(), kind=kind_sql(), key=key)


def _live_sql(con, run_id: str, by: str, step_sql: str) -> str:
    key = key_sql(con, run_id, by)
    return _head(con, run_id, step_sql, key) + _AGG.format(key="gkey", op=_OP[by])


def _state(con, run_id: str):
    """(status, events) of the run, or None."""
    return con.execute("SELECT status, events FROM runs WHERE run_id = $run", {"run": run_id}).fetchone()


def op_stats(con, run_id: str, by: str = "op", step=None) -> list[dict]:
    _check(by)
    return with_members(con, run_id, _op_stats(con, run_id, by, step), by)


def _op_stats(con, run_id: str, by: str, step) -> list[dict]:
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


# a cached grouping's name carries the rules it was computed with: a store cached before nested same-group ops
# were counted once (issue 27, @2), before a compiler stack's device was a host thread (@3), before any span with
# children (a plugin stack's region on a device track) left them its time (@4), or before ranks were apart and self
# capped at total (@5, issue 39), is recomputed, not read
_CACHE_RULES = "@5"


def _cached(con, run_id: str, by: str, events: int):
    by = by + _CACHE_RULES
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
            con.execute("DELETE FROM op_stats_cache WHERE run_id = $run AND starts_with(grouping, $by)",
                        {"run": run_id, "by": by + "@"})
            con.execute("DELETE FROM op_stats_cache WHERE run_id = $run AND grouping = $by", {"run": run_id, "by": by})
            con.execute(f"""INSERT INTO op_stats_cache
                SELECT $run, $by, $events, row_number() OVER (ORDER BY total_ns DESC, key), *
                FROM ({_live_sql(con, run_id, by, '')})""",
                        {"run": run_id, "by": by + _CACHE_RULES, "events": int(events)})
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


# --- time of a run: the union of top-level spans, per kind of track --------------------------------

KINDS = ("host", "device")


def union_ns(start, end) -> int:
    """How long at least one of the spans [start, end) runs: overlaps counted once."""
    import numpy as np
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum(end[order], start[order])
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    return int((reach[last] - s[first]).sum())


def top_level_spans(con, run_id: str) -> dict:
    """Top-level spans of a run as columns: step, kind (0 host, 1 device), start_ns, end_ns."""
    import numpy as np
    cols = con.execute(f"""SELECT step, ({kind_sql()}) = 'device' AS dev, start_ns, end_ns FROM events
                           WHERE run_id = $run AND {lane_depth_sql()} = 0""", {"run": run_id}).fetchnumpy()
    return {"step": np.asarray(cols["step"], np.int64), "device": np.asarray(cols["dev"], bool),
            "start": np.asarray(cols["start_ns"], np.int64), "end": np.asarray(cols["end_ns"], np.int64)}


def run_times(con, run_id: str, spans: dict | None = None) -> dict:
    """What a run's time is, counted once: busy_ns (any track busy), host_ns and device_ns (each kind
    busy), span_ns (first start to last end, idle included), and per step the same with its ops count.

    {"busy_ns", "host_ns", "device_ns", "span_ns", "steps": [{"step", "busy_ns", "span_ns", "host_ns",
     "device_ns", "ops"}...]}; the per-step rows in step order."""
    import numpy as np
    sp = spans if spans is not None else top_level_spans(con, run_id)

    def times(mask) -> dict:
        s, e, d = sp["start"][mask], sp["end"][mask], sp["device"][mask]
        return {"busy_ns": union_ns(s, e), "host_ns": union_ns(s[~d], e[~d]), "device_ns": union_ns(s[d], e[d]),
                "span_ns": int(e.max() - s.min()) if len(s) else 0}

    out = times(slice(None))
    out["steps"] = []
    for step in np.unique(sp["step"]):
        m = sp["step"] == step
        out["steps"].append({"step": int(step), "ops": int(m.sum()), **times(m)})
    return out


def step_count(times: dict) -> int:
    """How many steps a run's events hold (at least 1): what every per-step number divides by. Not the run's
    `steps` field, which says what was asked for (a trace tiled 53 times, or a run stopped early, differs)."""
    return max(len(times["steps"]), 1)


def per_step(rows: list[dict], steps: int, keys=("total_ns", "self_ns", "count", "flops", "bytes")) -> list[dict]:
    """Op rows with `<key>_per_step` for each of `keys`: the one division by the step count that Compare, the
    Operators page and the CLI all show (so they agree for the same runs)."""
    steps = max(int(steps or 1), 1)
    for r in rows:
        for k in keys:
            if k in r:
                r[f"{k}_per_step"] = (r[k] or 0) / steps
    return rows


def step_summary(times: dict) -> dict:
    """count, mean busy time per step, and the slowest step (by its span: what a step costs end to end)."""
    steps = times["steps"]
    if not steps:
        return {"count": 0, "mean_ns": 0.0, "slowest": None}
    slowest = max(steps, key=lambda r: r["span_ns"])
    return {"count": len(steps), "mean_ns": sum(r["span_ns"] for r in steps) / len(steps), "slowest": slowest}


# --- the Operators table: host and device apart, with total and self shares -----------------------

_BREAKDOWN = """
    SELECT {key} AS key, kind, {op} AS op, count(*) FILTER (WHERE is_outer) AS count, sum(incl)::BIGINT AS total_ns,
           least(sum(self_dur), sum(incl))::BIGINT AS self_ns, avg(dur) FILTER (WHERE is_outer) AS mean_ns,
           quantile_cont(dur, [0.5, 0.95]) FILTER (WHERE is_outer) AS q,
           (sum(flops) FILTER (WHERE is_outer))::BIGINT AS flops, (sum(bytes) FILTER (WHERE is_outer))::BIGINT AS bytes,
           CASE WHEN sum(incl) > 0 THEN coalesce(sum(flops) FILTER (WHERE is_outer), 0) / (sum(incl) / 1e9)
                ELSE 0 END AS achieved_flops,
           bool_or(fallback) AS fallback
    FROM ev GROUP BY ALL ORDER BY total_ns DESC, key"""
BREAKDOWN_KEYS = ["key", "kind", "op", "count", "total_ns", "self_ns", "mean_ns", "q", "flops", "bytes",
                  "achieved_flops", "fallback"]


def op_breakdown(con, run_id: str, by: str = "op", times: dict | None = None) -> list[dict]:
    """Per op (or module, or node) and kind of track: count, total and self time, percentiles, FLOP/s, and
    total_pct / self_pct: shares of the busy time of the op's kind (host or device), so self shares of a
    kind add up to at most 100 % and a nested op's self time counts where it is spent.

    Grouped by module, the rows roll up: a module's total is the self time of every op in it and in its
    submodules, its self the time of ops directly in it; the op shown is the one that takes most time."""
    _check(by)
    times = times or run_times(con, run_id)
    busy = {"host": times["host_ns"], "device": times["device_ns"]}
    head = _head(con, run_id, "", key_sql(con, run_id, by))
    if by == "module":
        rows = con.execute(head + _BREAKDOWN.format(key="gkey", op="op"), {"run": run_id}).fetchall()
        out = _roll_up(rows)
    else:
        rows = con.execute(head + _BREAKDOWN.format(key="gkey", op=_OP[by]), {"run": run_id}).fetchall()
        out = []
        for r in rows:
            d = dict(zip(BREAKDOWN_KEYS, r))
            q = d.pop("q") or [None, None]
            d.update(p50_ns=q[0], p95_ns=q[1], depth=0)
            out.append(d)
    for d in out:
        for k in ("flops", "bytes", "total_ns", "self_ns", "count"):
            d[k] = int(d[k] or 0)
        d["fallback"] = bool(d["fallback"])
        b = busy.get(d["kind"]) or 0
        d["total_pct"] = 100.0 * d["total_ns"] / b if b else None
        d["self_pct"] = 100.0 * d["self_ns"] / b if b else None
    return with_members(con, run_id, out, by)


def _roll_up(rows) -> list[dict]:
    """(module, op, kind) aggregates -> one row per module prefix and kind, in tree order."""
    nodes: dict[tuple, dict] = {}
    for r in rows:
        module, kind, op, count, total, self_ns, _mean, _q, flops, nbytes, _ach, fallback = r
        parts = module.split(".") if module not in ("(top)", "") else ["(top)"]
        for i in range(1, len(parts) + 1):
            path = ".".join(parts[:i])
            n = nodes.setdefault((path, kind), {"key": path, "kind": kind, "count": 0, "total_ns": 0, "self_ns": 0,
                                                "flops": 0, "bytes": 0, "fallback": False, "ops": {},
                                                "depth": i - 1, "name": parts[i - 1]})
            n["count"] += count
            n["total_ns"] += int(self_ns or 0)          # the subtree's op time, each op counted once
            n["flops"] += int(flops or 0)
            n["bytes"] += int(nbytes or 0)
            n["fallback"] |= bool(fallback)
            n["ops"][op] = n["ops"].get(op, 0) + int(self_ns or 0)
            if i == len(parts):
                n["self_ns"] += int(self_ns or 0)
    children: dict[tuple, list] = {}
    for (path, kind), n in nodes.items():
        parent = path.rpartition(".")[0] if n["depth"] else None
        children.setdefault((parent, kind), []).append(n)
    out: list[dict] = []

    def walk(parent, kind):
        for n in sorted(children.get((parent, kind), []), key=lambda n: (-n["total_ns"], n["key"])):
            ops = n.pop("ops")
            n["op"] = max(ops, key=ops.get) if ops else None
            n["mean_ns"] = n["total_ns"] / n["count"] if n["count"] else None
            n["p50_ns"] = n["p95_ns"] = None
            n["achieved_flops"] = n["flops"] / (n["total_ns"] / 1e9) if n["total_ns"] else 0.0
            out.append(n)
            walk(n["key"], kind)

    for kind in KINDS:
        walk(None, kind)
    return out


# --- fused nodes: the ops each one runs --------------------------------------------------------------
# A fused node (the fuse pass) is one event; its members -- op, node, module path, source line -- are
# recorded with the run (config["placement"]["fused"], from the plan: runtime.passes.fuse.fused_members),
# so every table and export can say what ran inside it.

def fused_members(run: dict) -> dict[str, list[dict]]:
    """{fused node name: [{"op", "node", "module", "source"}, ...]} of a run (a store.get_run dict);
    empty for a run without fused nodes, or one recorded before runs kept them."""
    import json
    cfg = run.get("config") or {}
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            return {}
    place = cfg.get("placement") if isinstance(cfg, dict) else None
    fused = (place.get("fused") if isinstance(place, dict) else None) or cfg.get("fused") or {}
    return fused if isinstance(fused, dict) else {}


def members_of(fused: dict, node: str) -> list[dict]:
    """The members of event node `node` (a region's prefix `region2/` ignored); [] for any other node."""
    return fused.get(node) or fused.get(node.rpartition("/")[2]) or []


def member_chain(members: list[dict]) -> str:
    """`add -> layer_norm`: a fused node's member ops, in the order it runs them."""
    return " -> ".join(str(m.get("op", "?")) for m in members)


def with_members(con, run_id: str, rows: list[dict], by: str) -> list[dict]:
    """Rows of a run with fused nodes gain `members`: grouped by node, the node's member ops in order;
    by op (the `fused` row) or module, each distinct chain among its fused nodes with how many nodes run it."""
    if not rows or by not in _KEYS:
        return rows
    cfg = con.execute("SELECT config FROM runs WHERE run_id = $run", {"run": run_id}).fetchone()
    fused = fused_members({"config": cfg[0]} if cfg else {})
    if not fused:
        return rows
    found = con.execute(f"SELECT DISTINCT {key_sql(con, run_id, by)}, node FROM events WHERE run_id = $run AND op = 'fused'",
                        {"run": run_id}).fetchall()
    chains: dict = {}
    for key, node in found:
        chain = member_chain(members_of(fused, node))
        if chain:
            chains.setdefault(key, {}).setdefault(chain, set()).add(node)
    for r in rows:
        c = chains.get(r["key"])
        if c and by == "node":
            r["members"] = next(iter(c))
        elif c:
            r["members"] = "; ".join(f"{chain} ({len(nodes)})" for chain, nodes in sorted(c.items()))
    return rows
