"""Shares of a batch per rank: the split, the auto ratios from a probe, and re-balancing.

    rows = split_rows([0.7, 0.3], 10)                       # [7, 3]: largest remainder, >= 1 each
    ratios = ratios_from_speed([rows / seconds, ...])      # throughput -> shares
    rb = Rebalancer(tolerance=0.1, patience=2)
    change = rb.observe(step, rows=[7, 3], seconds=[0.7, 0.6])   # None, or a Change with its reason

Every rank runs the same Rebalancer on the same all-reduced step times, so every rank takes the
same decision at the same step without another message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import UsageError


def split_rows(ratios: list[float], rows: int) -> list[int]:
    """Rows per rank in proportion to `ratios`, every row placed once, every rank at least one row."""
    n = len(ratios)
    if rows < n:
        raise UsageError(f"a batch of {rows} rows cannot give each of {n} ranks a row: use a bigger batch "
                         "or fewer shares")
    total = sum(ratios)
    exact = [r / total * rows for r in ratios]
    counts = [int(e) for e in exact]
    for i in sorted(range(n), key=lambda i: exact[i] - counts[i], reverse=True)[:rows - sum(counts)]:
        counts[i] += 1
    for i in range(n):                 # a share too small for a row borrows one from the biggest
        if counts[i] == 0:
            counts[max(range(n), key=lambda j: counts[j])] -= 1
            counts[i] = 1
    return counts


def ratios_from_speed(speeds: list[float]) -> list[float]:
    """Shares proportional to throughput (rows per second): every rank finishes at the same time."""
    if not speeds or not all(math.isfinite(s) and s > 0 for s in speeds):
        raise UsageError(f"cannot derive ratios from measured throughputs {speeds}: every rank must do work")
    total = sum(speeds)
    return [s / total for s in speeds]


@dataclass
class Change:
    step: int
    old: list[float]
    new: list[float]
    reason: str
    rows: list[int] = field(default_factory=list)

    def as_event(self) -> dict:
        return {"kind": "rebalance", "step": self.step, "old_ratios": self.old, "new_ratios": self.new,
                "rows": self.rows, "reason": self.reason}


class Rebalancer:
    """Moves shares toward the measured speeds when the step is unbalanced, with hysteresis.

    Unbalanced: the slowest rank takes more than (1 + tolerance) x the mean rank time. The
    imbalance must last `patience` steps in a row before shares move, and after a move the next
    `patience` steps are not judged (they measure the new shares), so shares do not oscillate.
    """

    def __init__(self, ratios: list[float], *, tolerance: float = 0.10, patience: int = 2):
        self.ratios = list(ratios)
        self.tolerance = tolerance
        self.patience = patience
        self._bad = 0
        self._quiet = 0

    def observe(self, step: int, rows: list[int], seconds: list[float], why: list[str] | None = None) -> Change | None:
        if self._quiet:
            self._quiet -= 1
            return None
        if not all(s > 0 for s in seconds):
            return None
        mean = sum(seconds) / len(seconds)
        slow = max(range(len(seconds)), key=lambda i: seconds[i])
        if seconds[slow] <= (1 + self.tolerance) * mean:
            self._bad = 0
            return None
        self._bad += 1
        if self._bad < self.patience:
            return None
        new = ratios_from_speed([n / s for n, s in zip(rows, seconds)])
        total_rows = sum(rows)
        if split_rows(new, total_rows) == list(rows):
            return None                     # the batch is too small to move a row: nothing to gain
        self._bad, self._quiet = 0, self.patience
        note = f" ({why[slow]})" if why and why[slow] else ""
        reason = (f"rank {slow} took {seconds[slow] * 1e3:.3g} ms for {rows[slow]} rows, "
                  f"{seconds[slow] / mean - 1:.0%} over the mean rank time{note}, for {self.patience} steps")
        change = Change(step, [round(r, 4) for r in self.ratios], [round(r, 4) for r in new], reason,
                        split_rows(new, total_rows))
        self.ratios = new
        return change
