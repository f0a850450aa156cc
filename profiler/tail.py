"""A live run's newest spans in the collector's memory, from the moment each batch arrives: what a live page
asks for next ("the spans after my N-th").

The collector writes what arrived into the store a few times a second, one transaction each, and a read of the
store waits for a connection beside those writes: a page that read its new spans from there trailed the run by
the write interval plus the read (bench_live.py's stages). Here every batch is held as it is opened, before it
is written, and a page may wait on `since` (a long poll) until a span past its last one is here.

    tail = LiveTail()
    tail.add(batch)                      # the collector, as each batch arrives
    got = tail.since(n, wait_s=2.0)      # a server thread: spans n.. or None (not held: read the store)

The k-th span here is the k-th the store holds (its rowid order): the collector writes batches in the order
they arrive. Memory is bounded: the newest LIMIT spans are held (whole batches); a page further behind than
that reads the store, as every finished run's pages do.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from .batch import full_site

LIMIT = 500_000       # spans held (~20 MB of int64 columns): a page more than this behind reads the store


class LiveTail:
    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._chunks: deque = deque()       # (index of its first span, step, thread, events (n, 5) int64)
        self.first = 0                      # index of the oldest span still held
        self.total = 0                      # spans received so far
        self.sites: dict[int, tuple] = {}   # site id -> the site (batch.SITE_COLUMNS order)
        self.lanes: set[tuple[int, int]] = set()   # (site, thread) of every span received: the run's tracks
        self.ended = False                  # no more spans will come (the runner's end, or the collector stopped)
        self._cond = threading.Condition()

    def add(self, batch) -> None:
        with self._cond:
            for s in batch.sites:
                self.sites[s[0]] = full_site(s)
            if not batch.n:
                return
            ev = batch.events
            self._chunks.append((self.total, batch.step, batch.thread, ev))
            self.total += len(ev)
            self.lanes.update((int(s), batch.thread) for s in np.unique(ev[:, 0]))
            while self.total - self._chunks[0][0] - len(self._chunks[0][3]) >= self.limit:
                self._chunks.popleft()
                self.first = self._chunks[0][0]
            self._cond.notify_all()

    def end(self) -> None:
        """No more spans will come, and the store holds every one that came (the collector ends its tail after its
        last write): the spans held are let go, so a finished run's LiveRun, kept by a server that goes on serving,
        holds none of them; a reader reads the store, as for any finished run."""
        with self._cond:
            self.ended = True
            self._chunks.clear()
            self.first = self.total
            self._cond.notify_all()

    def wait(self, n: int, wait_s: float) -> bool:
        """Wait up to wait_s until a span past the first n is here or none will come; whether one is."""
        with self._cond:
            self._cond.wait_for(lambda: self.total > n or self.ended, max(0.0, wait_s))
            return self.total > n

    def since(self, n: int) -> dict | None:
        """Spans n.. in arrival order as int64 columns {site, thread, step, seq, start_ns, end_ns}, with "sites" and
        "lanes" as of then (what names them and their tracks) and the "total" received; None when span n is no
        longer held (the caller reads the store)."""
        n = max(int(n), 0)
        with self._cond:
            if n < self.first:
                return None
            parts = [c for c in self._chunks if c[0] + len(c[3]) > n]
            sites, lanes, total = dict(self.sites), set(self.lanes), self.total
        cols: dict[str, list] = {k: [] for k in ("site", "thread", "step", "seq", "start_ns", "end_ns")}
        for first, step, thread, ev in parts:
            ev = ev[max(n - first, 0):]
            cols["site"].append(ev[:, 0])
            cols["seq"].append(ev[:, 1])
            cols["start_ns"].append(ev[:, 2])
            cols["end_ns"].append(ev[:, 3])
            cols["step"].append(np.full(len(ev), step, np.int64))
            cols["thread"].append(np.full(len(ev), thread, np.int64))
        out: dict = {k: np.concatenate(v).astype(np.int64, copy=False) if v else np.zeros(0, np.int64)
                     for k, v in cols.items()}
        out.update(sites=sites, lanes=lanes, total=total)
        return out
