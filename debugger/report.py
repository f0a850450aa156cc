"""The accuracy report: every op's output against a reference backend, as a table (msprobe's columns).

    report = AccuracyReport(model, backend, reference)
    report.add(node, diff, seq)                 # one row per compared op (the lockstep's OpDiff)
    report.summary()                            # first failing op, first op that introduced error
    report.write("acc.csv") / report.write("acc.json")

`run_report(session, reference)` runs the model once with the lockstep as an executor hook and
returns the report: what `opscope diff` prints and `opscope debug --report` writes.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field

from opscope.runtime.errors import UsageError

from .lockstep import Lockstep, OpDiff
from .stats import to_host

# seq is the op's number as the TUI (#N/total) and `diff` (#N) show it: from 1, one numbering everywhere
COLUMNS = ("seq", "node", "op", "module", "source", "dtype", "shape", "cosine", "max_abs", "max_rel",
           "err", "local_err", "received_err", "significant", "tolerance", "error_from", "nan_both", "nan_mismatch",
           "one_thousandth_ratio", "five_thousandths_ratio", "status", "verdict", "region", "member")


@dataclass
class Row:
    seq: int
    node: str
    op: str
    module: str
    source: str
    dtype: str
    shape: str
    cosine: float
    max_abs: float
    max_rel: float
    err: float                 # total error against the reference run (scaled max abs)
    local_err: float           # the error this op adds: reference kernel on the backend's own inputs
    tolerance: float
    error_from: str            # "this op" | "inputs" | "" (within tolerance or not compared)
    nan_both: int
    nan_mismatch: int
    status: str                # pass | fail | nan | skip
    verdict: str
    received_err: float = 0.0  # the error its inputs brought (reference kernel, actual vs reference inputs)
    significant: bool = False  # added more error than rounding to its dtype explains, under tolerance too
    one_thousandth_ratio: float = float("nan")      # msprobe: share of values with relative error < 0.001
    five_thousandths_ratio: float = float("nan")    # ... < 0.005
    region: str = ""           # a member of a compiler stack's region: the region (its seq is the region's)
    member: int = 0            # ... and its number inside it, from 1

    @property
    def number(self) -> str:
        """#N as the TUI and `diff` show it; a region's member is #N.M (the region is one step, N)."""
        return f"{self.seq + 1}.{self.member}" if self.region else str(self.seq + 1)


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


@dataclass
class AccuracyReport:
    model: str
    backend: str
    reference: str
    tolerance: str = "per dtype"
    rows: list[Row] = field(default_factory=list)
    complete: bool = False          # a whole run (else: the ops run so far)
    notes: list[str] = field(default_factory=list)   # what could not be compared op by op, and why

    def record(self, node, diff: OpDiff | None, seq: int, lockstep: Lockstep) -> None:
        """The lockstep's answer for one executed op: a row, or for a region one row per compared member."""
        if node.op == "region":
            number = {id(m): i + 1 for i, m in enumerate(node.attrs["members"])}
            for m, d in lockstep.members:
                row = self.add(m, d, seq)
                row.region, row.member = node.name, number[id(m)]
            if lockstep.members_note and lockstep.members_note not in self.notes:
                self.notes.append(lockstep.members_note)
        elif diff is not None:
            self.add(node, diff, seq)

    def region_rows(self, name: str, seq: int) -> "AccuracyReport":
        """The rows of one region's members at one step (the TUI's per-op diff of a region)."""
        latest = {r.member: r for r in self.rows if r.region == name and r.seq == seq}   # this run's, not earlier steps'
        return AccuracyReport(self.model, self.backend, self.reference, self.tolerance,
                              [latest[k] for k in sorted(latest)], self.complete, list(self.notes))

    def add(self, node, diff: OpDiff, seq: int) -> Row:
        meta = next((m for m in node.output_meta if m is not None), None)
        if diff.introduced:
            origin = "this op"
        elif diff.exceeds or diff.nan_mismatch:
            origin = "inputs"
        else:
            origin = ""
        row = Row(seq, node.name, node.op, node.module_path, node.source, meta.dtype if meta else "",
                  "x".join(map(str, meta.shape)) if meta else "", diff.cosine, diff.max_abs, diff.max_rel,
                  diff.err, diff.local, diff.tolerance, origin, diff.nan_both, diff.nan_mismatch, diff.status,
                  diff.verdict(), diff.received, diff.significant, diff.one_thousandth, diff.five_thousandths)
        self.rows.append(row)
        return row

    def first(self, pred) -> Row | None:
        return next((r for r in self.rows if pred(r)), None)

    def ranked(self, n: int = 5) -> list[Row]:
        """The ops that added the most error themselves (local error), largest first; none that added none."""
        rows = [r for r in self.rows if r.local_err == r.local_err and r.local_err > 0]
        return sorted(rows, key=lambda r: -r.local_err)[:n]

    def summary(self) -> dict:
        fail = self.first(lambda r: r.status == "fail")
        made = self.first(lambda r: r.error_from == "this op")
        # where error began even when it stayed under tolerance: the first op over tolerance, else the
        # first whose own error is more than rounding explains
        origin = made or self.first(lambda r: r.significant)
        nan = self.first(lambda r: r.status == "nan" or r.nan_mismatch)
        counts = {k: sum(r.status == k for r in self.rows) for k in ("pass", "fail", "nan", "skip")}

        def name(r):
            return None if r is None else {"seq": r.seq + 1, "node": r.node, "op": r.op, "module": r.module,
                                           "source": r.source, "err": _num(r.err), "local_err": _num(r.local_err),
                                           "region": r.region, "member": r.member}
        if fail is None:
            line = f"all {len(self.rows)} compared ops within tolerance of {self.reference}"
            if nan is not None:
                line += f"; NaN/Inf on both sides from op #{nan.number} {nan.node} ({nan.op})"
        else:
            where = f" in {fail.module}" if fail.module else ""
            where += f" inside {fail.region}" if fail.region else ""
            line = (f"first failing op: #{fail.number} {fail.node} ({fail.op}{where}), err {fail.err:.3g} > "
                    f"tol {fail.tolerance:.3g}, error from {fail.error_from or 'inputs'}")
            if made is not None and made is not fail:
                line += f"; first op that introduced error: #{made.number} {made.node} ({made.op})"
        if origin is not None and origin is not made and (fail is None or origin.seq <= fail.seq):
            line += (f"; error began at #{origin.number} {origin.node} ({origin.op}): it adds "
                     f"{origin.local_err:.3g} itself, under tol {origin.tolerance:.3g} but more than rounding explains")
        for note in self.notes:
            line += f"; {note} (only the region's outputs compared)"
        return {"ops": len(self.rows), "counts": counts, "first_failing": name(fail),
                "first_introduced": name(made), "first_significant": name(self.first(lambda r: r.significant)),
                "error_origin": name(origin), "first_nan": name(nan), "complete": self.complete, "line": line}

    def as_dict(self) -> dict:
        return {"model": self.model, "backend": self.backend, "reference": self.reference,
                "tolerance": self.tolerance, "summary": self.summary(),
                "ops": [{**{k: (_num(v) if isinstance(v, float) else v) for k, v in vars(r).items()}, "seq": r.seq + 1}
                        for r in self.rows]}

    def csv_text(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in self.rows:
            w.writerow([r.seq + 1 if c == "seq" else _cell(getattr(r, c)) for c in COLUMNS])
        return out.getvalue()

    def json_text(self) -> str:
        return json.dumps(self.as_dict(), indent=1) + "\n"

    def write(self, path: str) -> str:
        """Write CSV or JSON by the file's extension; returns the path."""
        text = self.json_text() if path.endswith(".json") else self.csv_text()
        with open(path, "w", newline="") as f:
            f.write(text)
        return path


def _cell(v):
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    return v


def check_report_path(path: str) -> None:
    """Bad input before the model loads: the extension picks the format, the folder must exist."""
    if not path.endswith((".csv", ".json")):
        raise UsageError(f"--report {path}: give a .csv or .json file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--report {path}: folder {folder} does not exist")


class ReportHook:
    """An executor hook: every op through the lockstep, one report row each."""

    def __init__(self, lockstep: Lockstep, report: AccuracyReport):
        self.lockstep = lockstep
        self.report = report

    def after_op(self, call) -> None:
        outs = call.outputs if call.node.multi_output else [call.outputs]
        diff = self.lockstep.after_op(call, [to_host(o, call.backend) for o in outs])
        self.report.record(call.node, diff, call.seq, self.lockstep)


def run_report(session, reference: str, tolerance: float | None = None) -> AccuracyReport:
    """One run of the session's model with every op compared against `reference`."""
    lock = Lockstep(session.plan, session.inputs, reference, tolerance)
    report = AccuracyReport(session.spec, session.backend.name, reference,
                            "per dtype" if tolerance is None else repr(tolerance))
    lock.start()
    with session.executor.hooked(ReportHook(lock, report)):
        session.executor.run(*session.inputs)
    report.complete = True
    return report
