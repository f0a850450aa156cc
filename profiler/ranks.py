"""Multi-rank analyses (HTA's temporal breakdown, overlap, stragglers): each takes the events of a
run and returns a table (a list of row dicts) a page, the CLI or a test can use as is.

    ranks = Ranks.of_run(store, run_id)          # or Ranks(frame) for any {column: array} frame
    ranks.temporal_breakdown()    # per rank and step: compute / communication / idle seconds, overlap
    ranks.overlap()               # per rank: share of communication hidden under compute
    ranks.slow_rank()             # per step: the rank the others wait for, and how long they wait

An event is communication when its op is a collective (all_reduce, all_gather, broadcast, ...,
as opscope names them, or a gloo/nccl/c10d kernel from an imported trace); every other event is
compute. Within a rank's step window (first start to last end), idle = window - union of all busy
intervals; overlap = time when communication and compute run together.
"""
from __future__ import annotations

import re
import statistics

import numpy as np

_COMM = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|send|recv|"
                   r"nccl|gloo|c10d)", re.IGNORECASE)
COLUMNS = ["rank", "step", "op", "start_ns", "end_ns"]


def clock_of(run: dict) -> str:
    """"simulated" for a hybrid run with a described (sim) chip: its compute spans last the simulated time
    while its collectives are measured on the host, so waiting says nothing about which chip is slower;
    "wall" for everything else (profiled or imported: every span measured)."""
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    backends = cfg.get("backends") or (cfg.get("dist") or {}).get("backends") or []
    sim = [b for b in backends if isinstance(b, str) and (b.startswith("sim:") or b.endswith(".toml"))]
    return "simulated" if run.get("engine") == "dist" and sim else "wall"


# FSDP's record_function spans that copy into or out of a collective's buffer (fsdp:all_gather_copy_in): local
# copies that only carry a collective's name
_COPY = re.compile(r"copy_(in|out)\b", re.IGNORECASE)


def is_communication(op: str) -> bool:
    return bool(_COMM.search(op or "")) and not _COPY.search(op or "")


def _union(intervals) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals) -> int:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> int:
    """Total length where two unions (sorted, disjoint) overlap."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class Ranks:
    """The facade: the analyses below over one frame of events (columns as in COLUMNS)."""

    def __init__(self, frame: dict, clock: str = "wall"):
        missing = [c for c in COLUMNS if c not in frame]
        if missing:
            raise ValueError(f"rank analysis needs the event columns {', '.join(missing)}")
        self.frame = frame
        self.clock = clock
        self._breakdown = None

    @classmethod
    def of_run(cls, store, run_id: str) -> "Ranks":
        return cls(store.events_frame(run_id, columns=COLUMNS + ["live_bytes"]), clock_of(store.get_run(run_id)))

    def memory(self) -> list[dict]:
        """Per rank: the peak of the live bytes its events recorded, or None where its events carry none
        (a hybrid run's step spans, an import without memory): unknown, never a made-up '0 B'."""
        f = self.frame
        if "live_bytes" not in f:
            return []
        peak: dict[int, int] = {}
        for rank, live in zip(np.asarray(f["rank"]).tolist(), np.asarray(f["live_bytes"]).tolist()):
            peak[int(rank)] = max(peak.get(int(rank), 0), int(live or 0))
        return [{"rank": r, "peak_live_bytes": peak[r] or None} for r in sorted(peak)]

    def temporal_breakdown(self) -> list[dict]:
        if self._breakdown is None:
            f = self.frame
            groups: dict[tuple, dict] = {}
            for rank, step, op, s, e in zip(*(np.asarray(f[c]).tolist() for c in COLUMNS)):
                g = groups.setdefault((int(rank), int(step)), {"comm": [], "compute": []})
                g["comm" if is_communication(op) else "compute"].append((int(s), int(e)))
            rows = []
            for (rank, step), g in sorted(groups.items()):
                comm, comp = _union(g["comm"]), _union(g["compute"])
                busy = _union(comm + comp)
                window = busy[-1][1] - busy[0][0] if busy else 0
                overlap = _intersection(comm, comp)
                rows.append({"rank": rank, "step": step, "window_s": window / 1e9,
                             "compute_s": _length(comp) / 1e9, "communication_s": _length(comm) / 1e9,
                             "exposed_communication_s": (_length(comm) - overlap) / 1e9, "overlap_s": overlap / 1e9,
                             "idle_s": (window - _length(busy)) / 1e9})
            self._breakdown = rows
        return self._breakdown

    def overlap(self) -> list[dict]:
        """Per rank: communication time, how much of it ran under compute, and the ratio."""
        out: dict[int, dict] = {}
        for r in self.temporal_breakdown():
            o = out.setdefault(r["rank"], {"rank": r["rank"], "communication_s": 0.0, "overlap_s": 0.0})
            o["communication_s"] += r["communication_s"]
            o["overlap_s"] += r["overlap_s"]
        for o in out.values():
            o["overlap_ratio"] = o["overlap_s"] / o["communication_s"] if o["communication_s"] else 0.0
        return [out[k] for k in sorted(out)]

    def slow_rank(self) -> list[dict]:
        """Per step: the rank the others wait for. A collective ends when its last rank arrives, so the slow
        rank is the one that waits least in communication (exposed communication: not hidden under its own
        compute) -- whatever made it late, compute or time outside any op (a sleep, a stall, the host).
        `lag_s`: how much longer the rank that waited most waited than it did. Steps without communication,
        and runs on a simulated clock (see clock_of): the rank with the most compute."""
        by_step: dict[int, list[dict]] = {}
        for r in self.temporal_breakdown():
            by_step.setdefault(r["step"], []).append(r)
        rows = []
        for step, rs in sorted(by_step.items()):
            if self.clock == "wall" and any(r["communication_s"] for r in rs):
                slow = min(rs, key=lambda r: (r["exposed_communication_s"], -r["compute_s"]))
            else:
                slow = max(rs, key=lambda r: r["compute_s"])
            waits = [r["exposed_communication_s"] for r in rs]
            rows.append({"step": step, "slow_rank": slow["rank"], "compute_s": slow["compute_s"],
                         "median_compute_s": statistics.median(r["compute_s"] for r in rs),
                         "wait_s": slow["exposed_communication_s"],
                         "lag_s": max(waits) - slow["exposed_communication_s"]})
        return rows

    def summary(self) -> dict:
        """Per rank totals and the rank that is slowest most often (what a Ranks page shows first)."""
        per: dict[int, dict] = {}
        for r in self.temporal_breakdown():
            p = per.setdefault(r["rank"], {"rank": r["rank"], "steps": 0, "compute_s": 0.0, "communication_s": 0.0,
                                            "idle_s": 0.0})
            p["steps"] += 1
            for k in ("compute_s", "communication_s", "idle_s"):
                p[k] += r[k]
        # the rank the others waited for longest in all (the sum of its steps' lag), not the one named in
        # the most steps: a busy host's jitter names either rank by a few ms in a step, a straggler by its
        # whole delay; steps without any lag (one rank, or a simulated clock) fall back to the count
        waited: dict[int, float] = {}
        count: dict[int, int] = {}
        for row in self.slow_rank():
            waited[row["slow_rank"]] = waited.get(row["slow_rank"], 0.0) + row["lag_s"]
            count[row["slow_rank"]] = count.get(row["slow_rank"], 0) + 1
        for k, p in per.items():
            p["others_waited_s"] = waited.get(k, 0.0)
        slowest = max(count, key=lambda k: (waited[k], count[k])) if count else None
        return {"ranks": [per[k] for k in sorted(per)], "slowest_rank": slowest,
                "world_size": len(per)}
