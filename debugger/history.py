"""Execution history: every op of the current run, its values kept within a memory budget.

    h = History(budget_bytes=256 << 20)
    h.add(Record(...))            # after every op (a few microseconds: references, no copies)
    h[i]                          # op i as it ran; older records keep their summary, not their values

Values are the backend's own objects (no host copy until a record is shown). The budget counts
each record's output bytes and its inputs that are not parameters; past it, the oldest records
drop their values and keep what was already summarised (stats, the comparison, the NaN sentence).
NOTE: an op that later writes into one of these values in place changes what history shows.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_RECORDS = 200_000        # a cap on the records themselves (a long training loop)


@dataclass
class Record:
    seq: int
    step: int
    call: object | None          # the OpCall (inputs, outputs, timing) while its values are kept
    diff: object = None
    nbytes: int = 0
    stop: object | None = None   # the Stop made for it (a pause, or a look back): its stats stay
    extra: dict = field(default_factory=dict)

    @property
    def kept(self) -> bool:
        return self.call is not None


class History:
    def __init__(self, budget_bytes: int):
        self.budget = max(0, int(budget_bytes))
        self.records: deque[Record] = deque(maxlen=MAX_RECORDS)
        self.bytes = 0
        self._oldest_kept = 0        # index into records of the oldest record still holding values

    def clear(self) -> None:
        self.records.clear()
        self.bytes = 0
        self._oldest_kept = 0

    def add(self, rec: Record) -> None:
        if len(self.records) == self.records.maxlen:
            self._drop(self.records[0])
            self._oldest_kept = max(0, self._oldest_kept - 1)
        self.records.append(rec)
        self.bytes += rec.nbytes
        # the newest record always keeps its values (it is the op on screen); older ones go first
        while self.bytes > self.budget and self._oldest_kept < len(self.records) - 1:
            self._drop(self.records[self._oldest_kept])
            self._oldest_kept += 1

    def _drop(self, rec: Record) -> None:
        if rec.call is None:
            return
        self.bytes -= rec.nbytes
        rec.call = None
        if rec.stop is not None:
            rec.stop.inputs = [(lab, None) for lab, _ in rec.stop.inputs]
            rec.stop.outputs = [(lab, None) for lab, _ in rec.stop.outputs]
            rec.stop.dropped = True

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Record:
        return self.records[i]

    def last_of(self, seq: int) -> int | None:
        """Index of the newest record of op `seq` in this run."""
        for i in range(len(self.records) - 1, -1, -1):
            if self.records[i].seq == seq:
                return i
        return None
