"""What -b auto takes, checked without torch (the CLI checks it before the model loads), and its settings."""
from __future__ import annotations

import contextvars
import difflib
import os

from ..errors import UsageError

NAME = "auto"
DEFAULT_BUDGET = 48                 # candidate regions measured at most (each is a compile of seconds)
# the stacks' intra-op threads while the search measures and runs (None: each stack's own default); the
# benchmark's one thread sets it
THREADS: contextvars.ContextVar = contextvars.ContextVar("opscope_auto_threads", default=None)


def per_op_names() -> list[str]:
    """Per-op backends auto may name (they run what no stack takes): opscope's own kernels on this host."""
    from .. import registry
    return [n for n, e in registry.entries().items() if e.host_kernels]


def is_auto(spec) -> bool:
    return isinstance(spec, str) and (spec.strip() == NAME or spec.strip().startswith(NAME + ":"))


def candidates(spec: str) -> list[str] | None:
    """The specs `auto:a,b,c` names (checked by form: each a registered stack or a per-op host backend);
    None for a bare `auto` (every installed stack). UsageError, one line, for anything else."""
    from .. import registry
    spec = spec.strip()
    if spec == NAME:
        return None
    named = [s.strip() for s in spec[len(NAME) + 1:].split(",")]
    if not all(named):
        raise UsageError(f"backend {spec!r}: auto: takes a comma-separated list of stacks, e.g. "
                         "auto:onnxruntime,openvino,torch:cpu")
    stacks, per_op = registry.names(kind="regions"), per_op_names()
    for s in named:
        base = s.partition(":")[0]
        entry = registry.get(base)
        if entry is None or not (entry.kind == "regions" or base in per_op):
            usage = stacks + [registry.get(p).usage.split(",")[0].strip() for p in per_op]
            close = difflib.get_close_matches(s, usage, n=1, cutoff=0.6)
            raise UsageError(f"backend {spec!r}: {s!r} is not a stack auto can choose: use {', '.join(usage)}"
                             + (f" (did you mean {close[0]}?)" if close else ""))
    if len([s for s in named if s.partition(":")[0] in per_op]) > 1:
        raise UsageError(f"backend {spec!r}: name one per-op backend (torch:DEVICE or numpy), not several")
    if len(set(named)) != len(named):
        raise UsageError(f"backend {spec!r}: a stack is named twice")
    return named


BUDGET_ENV = "OPSCOPE_AUTO_BUDGET"   # how the CLI's --budget reaches the search (a profile's runner process too)


def budget() -> int:
    try:
        n = int(os.environ.get(BUDGET_ENV, ""))
    except ValueError:
        return DEFAULT_BUDGET
    return n if n >= 1 else DEFAULT_BUDGET


def check_budget(n: int) -> int:
    if n < 1:
        raise UsageError(f"--budget must be at least 1 candidate region to measure, got {n}; leave it out for "
                         f"{DEFAULT_BUDGET}")
    return n
