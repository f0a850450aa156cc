"""The advisor on a debug session: the profiler's analyses and rules over the ops the debugger saw.

The model under the debugger is not a stored run, but the controller keeps one small record per
op that ran; with the plan's static facts (FLOPs, bytes, dtypes) that is what the advisor reads
from a run (`opscope.profiler.advisor.RunData`). Op times are each op's own clock time: the
pauses between ops are the user's, so the ops are laid end to end (no idle gaps are invented).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .stats import op_seconds


@dataclass
class SessionAdvice:
    advice: list                    # [opscope.profiler.advisor.Advice], biggest estimated gain first
    ops: int                        # ops the advice is based on
    total: int                      # ops in the plan
    complete: bool                  # a whole run (else: the ops run so far in this one)
    seconds: float                  # the step's busy time the gains are fractions of
    simulated: bool
    notes: list = field(default_factory=list)


def _dtype(metas) -> str | None:
    for m in metas or ():
        dt = str(getattr(m, "dtype", "") or "").replace("torch.", "")
        if dt.startswith(("float", "bfloat")):
            return dt
    return None


def _int(fn) -> int:
    try:
        return int(fn())
    except Exception:           # a cost model that cannot handle this node: 0, as the profiler does
        return 0


def events(ctl, records) -> list[dict]:
    """The advisor's event dicts for the controller's op records."""
    out = []
    t = 0
    for step, seq, start_ns, end_ns, timing, live, backend, fallback in records:
        node = ctl.steps[seq].node
        secs = op_seconds(start_ns, end_ns, timing) or 0.0
        ns = int(secs * 1e9)
        out.append({"step": 0, "seq": seq, "op": node.op, "node": node.name, "backend": backend,
                    "start": t, "end": t + ns, "seconds": ns / 1e9,
                    "bytes": _int(lambda: node.bytes_moved), "flops": _int(lambda: node.flops),
                    "fallback": fallback, "live_bytes": int(live or 0),
                    "phase": node.attrs.get("phase", "forward"), "rank": 0, "world_size": 1,
                    "dtype": _dtype(node.input_meta) or _dtype(node.output_meta) or "float32"})
        t += ns
    return out


def advise_session(ctl, model: str = "") -> SessionAdvice:
    """Run the bundled rule packs over the last whole run (or, before one finished, this run so far)."""
    from opscope.profiler.advisor import RunData, analyze, evaluate, load_rules

    complete = bool(ctl.last_run)
    records = list(ctl.last_run if complete else ctl.seen)
    backend = ctl.session.backend
    run = {"run_id": "debug", "model": model or getattr(ctl.session, "spec", ""), "backend": backend.name,
           "device": backend.device, "engine": "debug"}
    evs = events(ctl, records)
    analyses = analyze(RunData(run, evs, backend.description, 1))
    notes = []
    if not complete:
        notes.append(f"based on the {len(evs)} of {len(ctl.steps)} ops run so far: c runs to the end "
                     "for advice on the whole model")
    if not analyses["run"]["simulated"]:
        notes.append("op times are measured under the debugger (hooks, syncs): `opscope profile` then "
                     "`opscope advise` gives cleaner numbers")
    return SessionAdvice(evaluate(load_rules([]), analyses), len(evs), len(ctl.steps), complete,
                         analyses["time"]["seconds"], analyses["run"]["simulated"], notes)
