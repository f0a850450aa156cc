"""Which span encloses which, from times alone, for a million spans without a Python loop per span.

Spans on one lane (a thread, a stream) nest by time: sorted by (lane, start, -end), each span sits in
the nearest earlier span of its lane that is still open at its start. That is the stack sweep every
trace viewer does (pop what has ended, the top is the parent), answered with numpy:

    parent = open_parents(lane, start, end)      # in sorted order; -1 for a top-level span
    depth = ancestor_count(parent, np.ones(n, bool))
    owner = nearest_marked(parent, is_module)    # the innermost enclosing span that is a module (or itself)

"Still open" is the sweep's rule: a span ends *before* one that starts where it ends, except that a
zero-length span at that instant is still inside it. Why the nearest open one is the sweep's top: every
span between them in the order was popped, because it ended by then; and a span that does not enclose
the next one cannot hide one that does, so the search may jump from a closed candidate to its own parent.
Each loop below halves the remaining distance for every span at once (pointer jumping): a handful of
passes for the depth of a real trace.
"""
from __future__ import annotations

import numpy as np


def sweep_order(lane: np.ndarray, start: np.ndarray, end: np.ndarray, *ties) -> np.ndarray:
    """The order the sweep visits spans in: by lane, start, longest first, then the given tie-breakers."""
    return np.lexsort((*reversed(ties), ~end, start, lane))      # ~end: -end - 1, which no int64 overflows


def open_parents(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Spans already in sweep order -> the position of each one's parent (-1: top level)."""
    n = len(start)
    parent = np.arange(-1, n - 1, dtype=np.int64)
    if n == 0:
        return parent
    firsts = np.flatnonzero(np.r_[True, lane[1:] != lane[:-1]])
    parent[firsts] = -1
    zero = end == start

    def closed(ended, k):
        """Whether spans that ended at `ended` are closed for spans k: they ended by k's start -- strictly
        before it, where k is a zero-length span (compared, not shifted by one: no int64 wraps)."""
        return (ended < start[k]) | ((ended == start[k]) & ~zero[k])

    # top level at once: nothing earlier on the lane is still open (a running maximum of the ends per lane), so
    # the jumps below are only for spans inside others -- a flat run, or a lane of top-level ops, takes no jumps
    latest = np.empty(n, dtype=np.int64)
    for a, b in zip(firsts.tolist(), [*firsts[1:].tolist(), n]):
        np.maximum.accumulate(end[a:b], out=latest[a:b])
    parent[1:][closed(latest[:-1], np.arange(1, n))] = -1
    k = np.flatnonzero(parent >= 0)
    while len(k):
        c = parent[k]
        shut = closed(end[c], k)
        k, c = k[shut], c[shut]
        parent[k] = parent[c]        # what lies between c's parent and c closed before c started: before k too
        k = k[parent[k] >= 0]
    return parent


def nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """The nearest span on each one's chain of parents, itself included, that is marked; -1 where none is."""
    found = np.where(marked, np.arange(len(parent)), parent)
    k = np.flatnonzero(found >= 0)
    k = k[~marked[found[k]]]
    while len(k):
        found[k] = found[found[k]]
        k = k[found[k] >= 0]
        k = k[~marked[found[k]]]
    return found


def ancestor_count(parent: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Sum of `weight` over each span's enclosing spans (itself excluded)."""
    own = np.asarray(weight, dtype=np.int64)
    total, up = own.copy(), parent.copy()
    k = np.flatnonzero(up >= 0)
    while len(k):
        j = up[k]
        total[k] += total[j]         # both from before this pass: each pass doubles the stretch summed
        up[k] = up[j]
        k = k[up[k] >= 0]
    return total - own


def nesting_depth(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many spans of the same lane enclose each span (0 = top level), from times alone."""
    n = len(start)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return depth
    lane, start, end = (np.asarray(a, dtype=np.int64) for a in (lane, start, end))
    order = sweep_order(lane, start, end)
    parent = open_parents(lane[order], start[order], end[order])
    depth[order] = ancestor_count(parent, np.ones(n, dtype=bool))
    return depth


def innermost_at(lane, start, end, at_lane, at_time) -> np.ndarray:
    """For each instant (lane, time): the index of the innermost span on that lane running then -- started at or
    before it, ended at or after it -- or -1. The instants go into the sweep as zero-length spans after the spans
    that start with them; each one's nearest enclosing span is the answer."""
    n, m = len(start), len(at_time)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    ln = np.concatenate([np.asarray(lane, dtype=np.int64), np.asarray(at_lane, dtype=np.int64)])
    st = np.concatenate([np.asarray(start, dtype=np.int64), np.asarray(at_time, dtype=np.int64)])
    en = np.concatenate([np.asarray(end, dtype=np.int64), np.asarray(at_time, dtype=np.int64)])
    is_instant = np.r_[np.zeros(n, dtype=bool), np.ones(m, dtype=bool)]
    order = sweep_order(ln, st, en, is_instant)
    parent = open_parents(ln[order], st[order], en[order])
    instants = np.flatnonzero(order >= n)
    owner = nearest_marked(parent, order < n)[instants]
    found = np.full(m, -1, dtype=np.int64)
    found[order[instants] - n] = np.where(owner >= 0, order[np.maximum(owner, 0)], -1)
    return found
