"""A run's call tree for a flame graph (icicle): Python stacks, or op nesting, merged by path.

    tree = flame_tree(store, run_id, kind="stacks")     # or kind="ops"; step=N for one step
    tree["name"], tree["depth"], tree["x"], tree["total"], tree["self"], tree["calls"]   # one entry per node
    heaviest(tree)                                       # per name: self and total time, biggest self first

A span's parent is the span one level up on its own thread that covers its start (stacks: depth; ops: the
lane depth the timeline draws). Spans with the same path of names merge into one node, as flame graphs do: a
node's total is its spans' time (each cut to its parent's span, so a child never outgrows its parent), its
self time is the total less its children's. Node 0 is the root ("all threads"); its total is the time of the
top-level spans, and every share on the page is of it.
"""
from __future__ import annotations

import numpy as np

KINDS = ("stacks", "ops")
MAX_NODES = 20_000        # nodes sent to the browser; narrower ones are left out (their time stays in the parent)


def flame_tree(store, run_id: str, kind: str = "stacks", step: int | None = None) -> dict:
    """The merged tree as parallel lists (pre-order: a node's children follow it), laid out for an icicle."""
    if kind == "stacks":
        return layout(merge(_stack_rows(store, run_id, step)))
    return layout(merge(_op_rows(store, run_id, step), thread_name=str))


def _stack_rows(store, run_id: str, step):
    window = ""
    params: list = [run_id]
    if step is not None:         # a step's stacks: those that start inside its ops' window
        window = ("AND t_ns >= (SELECT min(start_ns) FROM events WHERE run_id = ? AND step = ?) "
                  "AND t_ns < (SELECT max(end_ns) FROM events WHERE run_id = ? AND step = ?)")
        params += [run_id, step, run_id, step]
    return store.query(f"""SELECT thread, depth, t_ns, t_ns + greatest(dur_ns, 0), frame FROM stacks
                           WHERE run_id = ? {window} ORDER BY thread, t_ns, depth""", params)


def _op_rows(store, run_id: str, step):
    from opscope.profiler.stats import lane_depth_sql
    run = store.get_run(run_id)
    name = "node" if run.get("engine") == "import" else "op"      # a trace's own name (aten::mm), else the op
    where = "AND step = ?" if step is not None else ""
    rows = store.query(f"""SELECT backend || ' · ' || coalesce(device, '') || ' · ' || coalesce(thread, 0),
                                  {lane_depth_sql()} AS d, start_ns, greatest(end_ns, start_ns), coalesce({name}, op)
                           FROM events WHERE run_id = ? {where} ORDER BY 1, start_ns, d""",
                       [run_id, *([step] if step is not None else [])])
    return rows


def merge(rows, thread_name=lambda t: f"thread {t}") -> dict:
    """Rows (thread, depth, start, end, name) sorted by thread, start, depth -> the merged tree:
    {name: [...], parent: [...], total: [...], calls: [...]} with node 0 the root."""
    names, parent, total, calls = ["all"], [-1], [0.0], [0]
    child: dict[tuple[int, str], int] = {}
    threads: dict = {}
    stack: list[tuple[int, int, int]] = []     # open spans of this thread: (depth, end, node)
    current = object()
    for thread, depth, start, end, name in rows:
        if thread != current:
            current, stack = thread, []
        depth = int(depth or 0)
        while stack and (stack[-1][0] >= depth or stack[-1][1] <= start):
            stack.pop()
        if stack:
            up, up_end = stack[-1][2], stack[-1][1]
        else:
            up = threads.get(thread)
            if up is None:
                up = threads[thread] = _node(names, parent, total, calls, child, 0, thread_name(thread))
            up_end = end
        node = _node(names, parent, total, calls, child, up, str(name))
        end = min(end, up_end)                  # cut to the parent: a child never outgrows it
        total[node] += max(0, end - start)
        calls[node] += 1
        stack.append((depth, end, node))
    total_a, up_a = np.asarray(total, np.float64), np.asarray(parent, np.int64)
    # a thread's time is its top-level spans'; the root's, every thread's
    below = np.bincount(up_a[1:], weights=total_a[1:], minlength=len(names))
    for node in threads.values():
        total_a[node] = below[node]
    total_a[0] = sum(total_a[node] for node in threads.values())
    if len(threads) == 1:                       # one thread: its node says nothing the root does not
        only = next(iter(threads.values()))
        names[0] = f"all ({names[only]})"
        parent = [0 if p == only else p for p in parent]
        parent[only] = -2                       # left out of the layout
    return {"name": names, "parent": parent, "total": total_a.tolist(), "calls": calls}


def _node(names, parent, total, calls, child, up: int, name: str) -> int:
    key = (up, name)
    k = child.get(key)
    if k is None:
        k = child[key] = len(names)
        names.append(name)
        parent.append(up)
        total.append(0.0)
        calls.append(0)
    return k


def layout(tree: dict, max_nodes: int = MAX_NODES) -> dict:
    """Pre-order nodes with depth and x (ns from the left edge), children widest first; self = total - children."""
    names, parent, total, calls = tree["name"], tree["parent"], tree["total"], tree["calls"]
    kids: dict[int, list[int]] = {}
    for k, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(k)
    root_total = total[0] if names else 0.0
    floor = root_total / max_nodes / 4 if root_total > 0 else 0.0   # narrower than this cannot be seen anyway
    out = {k: [] for k in ("name", "depth", "x", "total", "self", "calls", "parent")}
    todo = [(0, 0, 0.0, -1)]
    while todo and len(out["name"]) < max_nodes:
        k, depth, x, up = todo.pop()
        here = len(out["name"])
        ch = sorted(kids.get(k, []), key=lambda c: -total[c])
        kid_total = sum(total[c] for c in ch)
        for key, v in (("name", names[k]), ("depth", depth), ("x", x), ("total", total[k]),
                       ("self", max(0.0, total[k] - kid_total)), ("calls", calls[k]), ("parent", up)):
            out[key].append(v)
        at, later = x, []
        for c in ch:
            if total[c] > floor:
                later.append((c, depth + 1, at, here))
            at += total[c]
        todo.extend(reversed(later))        # pre-order, widest child first
    out["root_total"] = root_total
    out["nodes"] = len(names)
    return out


def heaviest(tree: dict, top: int = 50) -> list[dict]:
    """Per name: self time (every node of it) and total time (counted once where it recurses), calls."""
    by: dict[str, dict] = {}
    path: list[str] = []          # the names from the root to the node being visited (pre-order walk)
    depth = tree["depth"]
    for i, name in enumerate(tree["name"]):
        del path[depth[i]:]
        row = by.setdefault(name, {"name": name, "self": 0.0, "total": 0.0, "calls": 0})
        row["self"] += tree["self"][i]
        if name not in path:
            row["total"] += tree["total"][i]
            row["calls"] += tree["calls"][i]
        path.append(name)
    rows = sorted(by.values(), key=lambda r: -r["self"])
    return [r for r in rows if r["self"] > 0][:top] if tree["name"] else []
