"""Two runs side by side, op by op: matched by node name, so a model on two backends lines up.

Times are per step (mean over the recorded steps), so runs with different --steps compare fairly.
ratio = B / A: above 1, B is slower.
"""
from __future__ import annotations


def compare_runs(store, run_a: str, run_b: str) -> dict:
    a, b = store.get_run(run_a), store.get_run(run_b)
    na = {r["key"]: r for r in store.op_stats(a["run_id"], by="node")}
    nb = {r["key"]: r for r in store.op_stats(b["run_id"], by="node")}
    steps_a, steps_b = max(a.get("steps") or 1, 1), max(b.get("steps") or 1, 1)

    def per_step(r, steps):
        return r["total_ns"] / steps

    nodes = []
    for key in [k for k in na if k in nb]:
        ta, tb = per_step(na[key], steps_a), per_step(nb[key], steps_b)
        nodes.append({"node": key, "op": na[key]["op"], "op_b": nb[key]["op"], "a_ns": ta, "b_ns": tb,
                      "ratio": tb / ta if ta > 0 else None, "fallback_a": na[key]["fallback"],
                      "fallback_b": nb[key]["fallback"]})
    nodes.sort(key=lambda r: -abs(r["b_ns"] - r["a_ns"]))
    only_a = [{"node": k, "op": r["op"], "a_ns": per_step(r, steps_a)} for k, r in na.items() if k not in nb]
    only_b = [{"node": k, "op": r["op"], "b_ns": per_step(r, steps_b)} for k, r in nb.items() if k not in na]
    ops: dict[str, dict] = {}
    for r in nodes:
        o = ops.setdefault(r["op"], {"op": r["op"], "nodes": 0, "a_ns": 0.0, "b_ns": 0.0})
        o["nodes"] += 1
        o["a_ns"] += r["a_ns"]
        o["b_ns"] += r["b_ns"]
    for o in ops.values():
        o["ratio"] = o["b_ns"] / o["a_ns"] if o["a_ns"] > 0 else None
    total_a = sum(per_step(r, steps_a) for r in na.values())
    total_b = sum(per_step(r, steps_b) for r in nb.values())
    return {"a": _brief(a), "b": _brief(b), "total_a_ns": total_a, "total_b_ns": total_b,
            "ratio": total_b / total_a if total_a > 0 else None, "matched": len(nodes),
            "ops": sorted(ops.values(), key=lambda o: -o["b_ns"]), "nodes": nodes, "only_a": only_a,
            "only_b": only_b}


def _brief(run: dict) -> dict:
    return {k: run.get(k) for k in ("run_id", "model", "backend", "engine", "status", "steps", "events")}
