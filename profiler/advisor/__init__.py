"""The advisor: analyses over a run, rules as data, what-if estimates, and apply-and-verify.

    from opscope.profiler.advisor import advise
    for a in advise(run_id):
        print(a.title, a.estimated_gain)
"""
from __future__ import annotations

from .analyses import RunData, analyze, load
from .engine import Advice, evaluate
from .rules import Rule, load_pack, load_rules

__all__ = ["Advice", "Rule", "RunData", "advise", "analyze", "evaluate", "load", "load_pack", "load_rules", "report"]


def report(run_id: str, store=None, rules: list | None = None,
           skipped: list | None = None) -> tuple[dict, list[Advice]]:
    """The analyses and the advice for a run (`rules`: extra rule files on top of the bundled packs; `skipped`
    gets the bundled rules the run's data broke, engine.evaluate says how)."""
    analyses = analyze(load(run_id, store))
    return analyses, evaluate(load_rules(rules or []), analyses, skipped)


def advise(run_id: str, store=None, rules: list | None = None) -> list[Advice]:
    """Ranked recommendations for a run, biggest estimated gain first."""
    return report(run_id, store, rules)[1]
