"""`-b auto`: the middle layer places each region of the graph on the stack that runs it fastest.

    backend = resolve("auto")                        # or "auto:onnxruntime,openvino,torch:cpu"
    plan = compile_plan(graph, backend)              # placement searches once (search.py), then places
    plan.placement.report()["auto"]                  # which stack got each segment, its time, the runners-up, gains

The candidates are every installed compiler stack (what the registry lists as kind "regions" and available here)
and one per-op backend (torch:cpu unless `auto:...` names numpy or another torch device): it runs what no chosen
stack takes. The search (search.py) cuts the graph's topological order into segments at module boundaries,
measures each distinct segment on each stack that claims it (a compiled region, one warm-up call, the median of a
few), and chooses by dynamic programming over the order (Collage, PACT 2022) with the transfers between stacks
counted; merged segments it only estimated are measured before they are chosen. The choice travels in plan files
(`opscope compile -b auto`) and in a cache under $OPSCOPE_HOME/autoplace, so a later command on the same graph
and candidates does not search again.

This module is light (no torch): the CLI checks a spec with it before the model loads.
"""
from __future__ import annotations

from .spec import (BUDGET_ENV, DEFAULT_BUDGET, NAME, THREADS, budget, candidates, check_budget, is_auto,
                   per_op_names)

__all__ = ["BUDGET_ENV", "DEFAULT_BUDGET", "NAME", "THREADS", "arm", "budget", "candidates", "check_budget",
           "is_auto", "per_op_names", "plan_entry", "resolve"]


def resolve(spec: str, resolve_spec):
    """The auto backend for `spec`; `resolve_spec` makes its candidates (runtime/backends.resolve)."""
    from .backend import create
    return create(spec, resolve_spec)


def arm(backend, entry, where: str) -> None:
    """A plan's choice (its "auto" entry) handed to the auto backend: placement uses it, nothing is measured."""
    from .backend import arm as _arm
    _arm(backend, entry, where)


def plan_entry(plan) -> dict | None:
    from .backend import plan_entry as _entry
    return _entry(plan)
