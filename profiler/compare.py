"""Two runs side by side, op by op: matched by node name, so a model on two backends lines up.

Times are per step (mean over the recorded steps), so runs with different --steps compare fairly.
ratio = B / A: above 1, B is slower.

A run's total is its time counted once (stats.run_times): the union of its top-level spans, host and
device apart; nested ops are not added to their parents, nor host time to device time. The headline
total is the busy time of either kind; a side whose ops ran on a simulated clock is flagged, since its
times are estimates from a description, not measurements.
"""
from __future__ import annotations

from . import stats


def compare_runs(store, run_a: str | dict, run_b: str | dict, by: str = "name") -> dict:
    """The comparison the CLI prints and the Compare page draws: every number per step (stats.per_step, each
    run divided by the steps its events hold), so runs of 5 and 2 steps of one model read 1.00x.

    ops: one row per op (grouped `by`, every event of both runs), a_ns / b_ns per step, a_count / b_count
    calls per step; nodes: the nodes both runs ran, matched by name; only_a / only_b: the others.
    run_a, run_b: ids, or the runs' rows as store.get_run gave them (a page that has them read)."""
    a, b = (r if isinstance(r, dict) else store.get_run(r) for r in (run_a, run_b))
    (ta, node_a, by_a), (tb, node_b, by_b) = side(store, a, by), side(store, b, by)
    sa, sb = max(ta["steps"], 1), max(tb["steps"], 1)
    na = {r["key"]: r for r in stats.per_step(node_a, sa)}
    nb = {r["key"]: r for r in stats.per_step(node_b, sb)}
    nodes = []
    for key in [k for k in na if k in nb]:
        x, y = na[key]["total_ns_per_step"], nb[key]["total_ns_per_step"]
        nodes.append({"node": key, "op": na[key]["op"], "op_b": nb[key]["op"], "a_ns": x, "b_ns": y,
                      "ratio": y / x if x > 0 else None, "fallback_a": na[key]["fallback"],
                      "fallback_b": nb[key]["fallback"]})
    nodes.sort(key=lambda r: -abs(r["b_ns"] - r["a_ns"]))
    only_a = [{"node": k, "op": r["op"], "a_ns": r["total_ns_per_step"]} for k, r in na.items() if k not in nb]
    only_b = [{"node": k, "op": r["op"], "b_ns": r["total_ns_per_step"]} for k, r in nb.items() if k not in na]
    oa = {r["key"]: r for r in stats.per_step(by_a, sa)}
    ob = {r["key"]: r for r in stats.per_step(by_b, sb)}
    ops = []
    for key in dict.fromkeys([*oa, *ob]):
        x, y = oa.get(key, {}), ob.get(key, {})
        a_ns, b_ns = x.get("total_ns_per_step", 0.0), y.get("total_ns_per_step", 0.0)
        ops.append({"op": key, "op_type": x.get("op") or y.get("op"), "a_ns": a_ns, "b_ns": b_ns,
                    "ratio": b_ns / a_ns if a_ns > 0 and b_ns > 0 else None,
                    "a_count": x.get("count_per_step", 0.0), "b_count": y.get("count_per_step", 0.0)})
    ops.sort(key=lambda o: (-(o["a_ns"] + o["b_ns"]), o["op"]))
    total_a, total_b = ta["busy_ns"], tb["busy_ns"]
    doc = {"a": _brief(a), "b": _brief(b), "total_a_ns": total_a, "total_b_ns": total_b, "per": "step",
           "steps_a": sa, "steps_b": sb, "by": by,
           "ratio": total_b / total_a if total_a > 0 else None, "matched": len(nodes),
           "ops": ops, "nodes": nodes, "only_a": only_a,
           "only_b": only_b, "totals": {"a": ta, "b": tb}, "warnings": warnings(ta, tb)}
    return doc


def side(store, run: dict, by: str = "name") -> tuple[dict, list[dict], list[dict]]:
    """One run's part of a comparison: (run_totals, op stats by node, op stats `by`), kept as one answer once the
    run is final (kept.py): read in one go, where its four queries opened the store four times (0.25 s each on
    a loaded machine, most of a 1M-event comparison's 7 s)."""
    from .kept import kept

    def compute():
        return {"totals": run_totals(store, run), "node": store.op_stats(run["run_id"], by="node"),
                "by": store.op_stats(run["run_id"], by=by)}
    got = kept(store, run, _side_name(by), compute)
    return got["totals"], got["node"], got["by"]


def side_is_kept(store, run: dict, by: str = "name") -> bool:
    """Whether side() reads this run's part from the store (no computing, no writing: a reader's open may hold it)."""
    from .kept import peek
    return peek(store, run, _side_name(by)) is not None


def _side_name(by: str) -> str:
    return f"compare:{by}"


def run_totals(store, run: dict) -> dict:
    """A run's time per step, counted once: busy (any kind), host, device; and whether its clock is simulated."""
    from .kept import kept, run_times
    t = run_times(store, run)         # kept once the run is final: a 1M-event run's took seconds on every visit
    sim = kept(store, run, "simulated", lambda: bool(store.query(
        "SELECT count(*) > 0 FROM events WHERE run_id = ? AND starts_with(device, 'sim:')", [run["run_id"]])[0][0]))
    steps = stats.step_count(t)
    return {"busy_ns": t["busy_ns"] / steps, "host_ns": t["host_ns"] / steps, "device_ns": t["device_ns"] / steps,
            "steps": len(t["steps"]), "simulated": bool(sim)}


def warnings(ta: dict, tb: dict) -> list[str]:
    """What makes the two totals not measure the same thing."""
    out = []
    if ta["simulated"] != tb["simulated"]:
        sim = "A" if ta["simulated"] else "B"
        out.append(f"run {sim} ran on a simulated clock: its times are estimates from the backend description, "
                   "the other run's are measured")
    if bool(ta["device_ns"]) != bool(tb["device_ns"]):
        dev = "A" if ta["device_ns"] else "B"
        out.append(f"only run {dev} has device time: compare host with host, device with device")
    return out


def _brief(run: dict) -> dict:
    return {k: run.get(k) for k in ("run_id", "model", "backend", "engine", "status", "steps", "events")}
