"""Nesting by time without a Python loop per span (profiler/importers/nesting.py), held to the stack sweep it
replaces: the sweep below is the specification -- pop what has ended, the top is the parent -- and random
spans (several lanes, zero-length spans, equal starts, spans that overlap without nesting) must get the same
parent, depth, nearest marked span and weighted ancestor count from both."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from opscope.profiler.importers.nesting import ancestor_count, innermost_at, nearest_marked, nesting_depth, open_parents, \
    sweep_order


def sweep_parents(lane, start, end) -> list[int]:
    """The stack sweep, span by span, over spans already in sweep order."""
    parents, stack, cur = [], [], None
    for k, (ln, s, e) in enumerate(zip(lane.tolist(), start.tolist(), end.tolist())):
        if ln != cur:
            stack.clear()
            cur = ln
        while stack and end[stack[-1]] <= s and not (end[stack[-1]] == s and e == s):
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(k)
    return parents


def chain(parents, k):
    while k >= 0:
        yield k
        k = parents[k]


spans = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 12)), min_size=0, max_size=80)


def arrays(items):
    lane = np.asarray([a for a, _, _ in items], dtype=np.int64)
    start = np.asarray([b for _, b, _ in items], dtype=np.int64)
    end = start + np.asarray([c for _, _, c in items], dtype=np.int64)
    return lane, start, end


@settings(max_examples=400, deadline=None)
@given(spans, st.data())
def test_vectorised_nesting_matches_the_stack_sweep(items, data):
    lane, start, end = arrays(items)
    order = sweep_order(lane, start, end)
    lane, start, end = lane[order], start[order], end[order]
    want = sweep_parents(lane, start, end)
    got = open_parents(lane, start, end).tolist()
    assert got == want

    n = len(want)
    marked = np.asarray(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    weight = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    parents = np.asarray(want, dtype=np.int64)
    nearest = nearest_marked(parents, marked).tolist()
    counts = ancestor_count(parents, weight).tolist()
    for k in range(n):
        up = list(chain(want, k))
        assert nearest[k] == next((j for j in up if marked[j]), -1)
        assert counts[k] == sum(int(weight[j]) for j in up[1:])


@settings(max_examples=200, deadline=None)
@given(spans)
def test_nesting_depth_is_the_sweeps_stack_height_in_the_callers_order(items):
    lane, start, end = arrays(items)
    order = sweep_order(lane, start, end)
    parents = sweep_parents(lane[order], start[order], end[order])
    want = np.zeros(len(items), dtype=np.int64)
    want[order] = [len(list(chain(parents, k))) - 1 for k in range(len(items))]
    assert nesting_depth(lane, start, end).tolist() == want.tolist()


def test_a_deep_nest_and_a_long_row_of_siblings():
    """The two shapes that make pointer jumping work hardest: 2,000 spans each inside the last, then 2,000
    back to back under one parent."""
    n = 2000
    start = np.concatenate([np.arange(n), [10 * n], 10 * n + 1 + 2 * np.arange(n)])
    end = np.concatenate([2 * n - np.arange(n), [20 * n], 10 * n + 2 + 2 * np.arange(n)])
    lane = np.zeros(len(start), dtype=np.int64)
    depth = nesting_depth(lane, start, end)
    assert depth[:n].tolist() == list(range(n))
    assert depth[n] == 0 and set(depth[n + 1:].tolist()) == {1}


def sweep_innermost(ops, queries) -> dict:
    """The sweep over ops and instants together: (start, end, name) ops and (time, row) instants on one lane ->
    {row: the innermost op running at that time}."""
    ops = sorted(ops, key=lambda o: (o[0], -o[1]))
    found, open_, k = {}, [], 0
    for t, row in sorted(queries):
        while k < len(ops) and ops[k][0] <= t:
            while open_ and open_[-1][0] < ops[k][0]:
                open_.pop()
            open_.append((ops[k][1], ops[k][2]))
            k += 1
        while open_ and open_[-1][0] < t:
            open_.pop()
        if open_:
            found[row] = open_[-1][1]
    return found


@settings(max_examples=300, deadline=None)
@given(spans, st.lists(st.tuples(st.integers(0, 2), st.integers(-2, 55)), max_size=40))
def test_innermost_at_matches_the_sweep(items, instants):
    lane, start, end = arrays(items)
    got = innermost_at(lane, start, end, [a for a, _ in instants], [t for _, t in instants]).tolist()
    for ln in range(3):
        ops = [(s, e, i) for i, (a, s, e) in enumerate(zip(lane.tolist(), start.tolist(), end.tolist())) if a == ln]
        queries = [(t, r) for r, (a, t) in enumerate(instants) if a == ln]
        want = sweep_innermost(ops, queries)
        for _, r in queries:
            assert got[r] == want.get(r, -1), (r, ops, queries)


def test_spans_at_the_ends_of_int64_nest_as_the_sweep_says():
    """The store keeps any int64 nanosecond: a zero-length span at the smallest one, and spans ending at the
    largest, must neither wrap around (-end, start - 1) nor change their order."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    start = np.asarray([lo, lo, lo, hi - 5, hi - 3, hi], dtype=np.int64)
    end = np.asarray([lo, lo + 10, lo + 2, hi, hi - 3, hi], dtype=np.int64)
    lane = np.zeros(len(start), dtype=np.int64)
    order = sweep_order(lane, start, end)
    want = sweep_parents(lane[order], start[order], end[order])
    assert end[order].tolist()[:3] == [lo + 10, lo + 2, lo]         # longest first, the zero-length one last
    assert open_parents(lane[order], start[order], end[order]).tolist() == want
    assert innermost_at(lane, start, end, [0, 0], [lo, hi]).tolist() == [0, 5]


def test_a_recorded_torch_profiler_trace_nests_as_the_sweep_says(layer_trace):
    """Real spans: a transformer layer profiled with Python stacks and memory. Its frames and ops (thousands,
    back to back, nested tens deep) get the sweep's parents and depths, and its [memory] samples the sweep's
    innermost op."""
    import json
    events = json.loads(layer_trace(3).read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op")]
    samples = [e for e in events if e.get("name") == "[memory]"]
    assert len(spans) > 1000 and {e["cat"] for e in spans} == {"python_function", "cpu_op"} and samples
    tids = {t: i for i, t in enumerate(sorted({str(e["tid"]) for e in spans + samples}))}
    lane = np.asarray([tids[str(e["tid"])] for e in spans], dtype=np.int64)
    start = np.asarray([round(float(e["ts"]) * 1000) for e in spans], dtype=np.int64)
    end = start + np.asarray([round(float(e["dur"]) * 1000) for e in spans], dtype=np.int64)
    order = sweep_order(lane, start, end)
    parents = open_parents(lane[order], start[order], end[order])
    assert parents.tolist() == sweep_parents(lane[order], start[order], end[order])
    # the depth of every span, against the sweep over an order Python sorts by itself
    by_python = np.asarray(sorted(range(len(spans)), key=lambda i: (lane[i], start[i], -end[i], i)))
    chain_of = sweep_parents(lane[by_python], start[by_python], end[by_python])
    want = np.zeros(len(spans), dtype=np.int64)
    want[by_python] = [len(list(chain(chain_of, k))) - 1 for k in range(len(spans))]
    depth = nesting_depth(lane, start, end)
    assert depth.tolist() == want.tolist() and depth.max() >= 5          # it does nest

    at_lane = [tids[str(e["tid"])] for e in samples]
    at_time = [round(float(e["ts"]) * 1000) for e in samples]
    got = innermost_at(lane, start, end, at_lane, at_time).tolist()
    for ln in set(at_lane):
        ops = [(s, e, i) for i, (a, s, e) in enumerate(zip(lane.tolist(), start.tolist(), end.tolist())) if a == ln]
        want = sweep_innermost(ops, [(t, r) for r, (a, t) in enumerate(zip(at_lane, at_time)) if a == ln])
        assert [got[r] for r, a in enumerate(at_lane) if a == ln] == [want.get(r, -1) for r, a in enumerate(at_lane)
                                                                      if a == ln]
    assert sum(g >= 0 for g in got) > len(got) // 2          # most samples fall inside an op
