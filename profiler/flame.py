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
        return layout(merge_columns(*_stack_columns(store, run_id, step), thread_name=lambda t: f"thread {t}"))
    tree = layout(merge_columns(*_op_columns(store, run_id, step), thread_name=str))
    tree["by_module"] = by_module(store, store.get_run(run_id), run_id)
    return tree


def _stack_columns(store, run_id: str, step):
    window = ""
    params: list = [run_id]
    if step is not None:         # a step's stacks: those that start inside its ops' window
        window = ("AND t_ns >= (SELECT min(start_ns) FROM events WHERE run_id = ? AND step = ?) "
                  "AND t_ns < (SELECT max(end_ns) FROM events WHERE run_id = ? AND step = ?)")
        params += [run_id, step, run_id, step]
    return _columns(store, f"""SELECT thread AS t, depth AS d, t_ns AS a, t_ns + greatest(dur_ns, 0) AS z,
                                      frame AS n FROM stacks WHERE run_id = ? {window}""", params)


def _op_columns(store, run_id: str, step):
    from opscope.profiler.stats import lane_depth_sql
    run = store.get_run(run_id)
    name = "node" if run.get("engine") == "import" else "op"      # a trace's own name (aten::mm), else the op
    where = "AND step = ?" if step is not None else ""
    params = [run_id, *([step] if step is not None else [])]
    track = "backend || ' · ' || coalesce(device, '') || ' · ' || coalesce(thread, 0)"
    if by_module(store, run, run_id):
        # a graph's ops do not nest in time: each sits under its module path (h.0, h.0.attn, h.0.attn.qkv), a
        # module's time the time of its ops
        return _columns(store, f"""WITH e AS (SELECT {track} AS t, start_ns AS a, greatest(end_ns, start_ns) AS z,
                                              op AS n, string_split(coalesce(module, ''), '.') AS parts
                                             FROM events WHERE run_id = ? {where}),
                                        m AS (SELECT t, a, z, parts, unnest(range(1, len(parts) + 1)) AS i FROM e
                                              WHERE parts[1] <> '')
                                   SELECT t, i - 1 AS d, a, z, array_to_string(parts[1:i], '.') AS n FROM m
                                   UNION ALL
                                   SELECT t, CASE WHEN parts[1] = '' THEN 0 ELSE len(parts) END AS d, a, z, n FROM e""",
                        params)
    return _columns(store, f"""SELECT {track} AS t, {lane_depth_sql()} AS d, start_ns AS a,
                                      greatest(end_ns, start_ns) AS z, coalesce({name}, op) AS n
                               FROM events WHERE run_id = ? {where}""", params)


def by_module(store, run: dict, run_id: str) -> bool:
    """Whether op nesting means module paths: an opscope run whose ops all run at one depth (a graph)."""
    if run.get("engine") == "import":
        return False
    rows = store.query("SELECT max(coalesce(depth, 0)), count(*) FILTER (WHERE coalesce(module, '') <> '') "
                       "FROM events WHERE run_id = ?", [run_id])
    return bool(rows and rows[0][0] == 0 and rows[0][1])


def _columns(store, rows_sql: str, params):
    """(thread codes, depth, start, end, name codes, thread labels, names) in thread, start, depth order: the
    strings turned into codes by the store (a million rows come back as arrays, not as a million tuples)."""
    with store.connect(read_only=True) as con:
        con.execute(f"CREATE TEMP TABLE flame_rows AS {rows_sql}", list(params))
        try:
            threads = [r[0] for r in con.execute("SELECT DISTINCT t FROM flame_rows ORDER BY t").fetchall()]
            names = [r[0] for r in con.execute("SELECT DISTINCT coalesce(n, '?') FROM flame_rows ORDER BY 1").fetchall()]
            c = con.execute("""SELECT dense_rank() OVER (ORDER BY t) - 1 AS tc, coalesce(d, 0) AS d, a, z,
                                      dense_rank() OVER (ORDER BY coalesce(n, '?')) - 1 AS nc
                               FROM flame_rows ORDER BY t, a, d""").fetchnumpy()
        finally:
            con.execute("DROP TABLE flame_rows")
    arr = (lambda k: np.asarray(c[k], np.int64))
    return arr("tc"), arr("d"), arr("a"), arr("z"), arr("nc"), threads, names


def merge(rows, thread_name=lambda t: f"thread {t}") -> dict:
    """Rows (thread, depth, start, end, name) sorted by thread, start, depth -> the merged tree:
    {name: [...], parent: [...], total: [...], calls: [...]} with node 0 the root."""
    if not rows:
        return merge_columns(*(np.zeros(0, np.int64),) * 5, [], [], thread_name)
    thread, depth, start, end, name = zip(*rows)
    tcode: dict = {}
    thr = np.asarray([tcode.setdefault(t, len(tcode)) for t in thread], np.int64)
    ncode: dict = {}
    nm = np.asarray([ncode.setdefault(str(x), len(ncode)) for x in name], np.int64)
    return merge_columns(thr, np.asarray([int(d or 0) for d in depth], np.int64), np.asarray(start, np.int64),
                         np.asarray(end, np.int64), nm, list(tcode), list(ncode), thread_name)


def merge_columns(thr, depth, start, end, nm, threads, label, thread_name=lambda t: f"thread {t}") -> dict:
    """merge() on columns: thread codes (into `threads`), depth, start, end, name codes (into `label`).

    A row's parent is the last row before it one level up, when that row (cut to its own parent) is still open
    at the row's start; else the row hangs from its thread. Vectorized a depth at a time: a million rows take
    about a second."""
    names, parent = ["all"], [-1]
    if not len(thr):
        return {"name": names, "parent": parent, "total": [0.0], "calls": [0]}
    for t in threads:                               # thread nodes: 1..T, under the root
        names.append(thread_name(t))
        parent.append(0)
    row_node = np.full(len(thr), -1, np.int64)
    cut = end.copy()
    known: dict = {}
    idx = np.arange(len(thr))
    prev = np.zeros(0, np.int64)
    for d in range(int(depth.max()) + 1):
        here = idx[depth == d]
        if not len(here):
            prev = here
            continue
        up = np.full(len(here), -1, np.int64)
        if len(prev):
            k = np.searchsorted(prev, here) - 1
            p = prev[np.maximum(k, 0)]
            ok = (k >= 0) & (thr[p] == thr[here]) & (cut[p] > start[here])
            up[ok] = p[ok]
            cut[here[ok]] = np.minimum(cut[here[ok]], cut[p[ok]])     # a child never outgrows its parent
        under = np.where(up >= 0, row_node[np.maximum(up, 0)], 1 + thr[here])
        keys = under * len(label) + nm[here]
        uniq, inv = np.unique(keys, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for j, key in enumerate(uniq.tolist()):
            node = known.get(key)
            if node is None:
                node = known[key] = len(names)
                names.append(label[key % len(label)])
                parent.append(key // len(label))
            ids[j] = node
        row_node[here] = ids[inv]
        prev = here
    total_a = np.bincount(row_node, weights=np.maximum(cut - start, 0).astype(np.float64), minlength=len(names))
    calls = np.bincount(row_node, minlength=len(names)).tolist()
    threads = list(range(1, 1 + len(threads)))
    # a thread's time is its top-level spans'; the root's, every thread's
    up_a = np.asarray(parent, np.int64)
    below = np.bincount(up_a[1:], weights=total_a[1:], minlength=len(names))
    total_a[threads] = below[threads]
    total_a[0] = total_a[threads].sum()
    if len(threads) == 1:                       # one thread: its node says nothing the root does not
        only = threads[0]
        names[0] = f"all ({names[only]})"
        parent = [0 if q == only else q for q in parent]
        parent[only] = -2                       # left out of the layout
    return {"name": names, "parent": parent, "total": total_a.tolist(), "calls": calls}


def layout(tree: dict, max_nodes: int = MAX_NODES) -> dict:
    """Pre-order nodes with depth and x (ns from the left edge), children widest first; self = total - children."""
    names, parent, total, calls = tree["name"], tree["parent"], tree["total"], tree["calls"]
    kids: dict[int, list[int]] = {}
    for k, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(k)
    root_total = total[0] if names else 0.0
    # a tree of more than max_nodes: what is narrower than this cannot be seen anyway, and is left out (its time in
    # its parent's total, in no one's self). A smaller tree is sent whole, so its self times add up to the whole.
    floor = root_total / max_nodes / 4 if root_total > 0 and len(names) > max_nodes else 0.0
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
    out["left_out"] = len(names) - parent.count(-2) - len(out["name"])    # narrower than the floor, or past max_nodes
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
