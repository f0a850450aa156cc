"""The advisor: analyses over a run, rules as data, what-if estimates, and apply-and-verify.

    from opscope.profiler.advisor import advise
    for a in advise(run_id):
        print(a.title, a.estimated_gain)
"""
from __future__ import annotations

import hashlib
import json

from .analyses import RunData, analyze, load
from .engine import Advice, evaluate
from .rules import Rule, load_pack, load_rules

__all__ = ["Advice", "Rule", "RunData", "advise", "analyze", "evaluate", "load", "load_pack", "load_rules", "report",
           "run_analyses"]

ANALYSES_ARTIFACT = "advisor-analyses"      # the artifacts kind a finished run's analyses are kept under
_ANALYSES_VERSION = 2                       # NOTE: bump when analyses.py changes what it computes


def report(run_id: str, store=None, rules: list | None = None,
           skipped: list | None = None) -> tuple[dict, list[Advice]]:
    """The analyses and the advice for a run (`rules`: extra rule files on top of the bundled packs; `skipped`
    gets the bundled rules the run's data broke, engine.evaluate says how)."""
    analyses = run_analyses(run_id, store)
    return analyses, evaluate(load_rules(rules or []), analyses, skipped)


def run_analyses(run_id: str, store=None) -> dict:
    """The analyses of a run, kept in the store once its events are final: a 1M-event run takes tens of seconds
    to analyse (one Python dict per event), so the advisor page and `advise` compute them once, then read them.
    Rules are evaluated afresh each time (a rule file may change; the run does not)."""
    from opscope.profiler.store import RunStore
    store = store or RunStore()
    run = store.get_run(run_id)
    key = _cache_key(run)
    if key:
        for _, name, blob in store.artifacts(run["run_id"], kind=ANALYSES_ARTIFACT):
            if name == key:
                return json.loads(blob)
    analyses = analyze(load(run["run_id"], store))
    text = json.dumps(analyses)
    # only what comes back equal is kept (a NaN, a tuple or an int key would not), so a read is never a change
    if key and json.loads(text) == analyses:
        from opscope.runtime.errors import OpscopeError
        try:
            store.add_artifact(run["run_id"], ANALYSES_ARTIFACT, key, text)
        except (OpscopeError, OSError):      # a store this process cannot write: analysed again next time
            pass
    return analyses


def _cache_key(run: dict) -> str | None:
    """What the analyses depend on: the events (their count, final once the run ended), the run's row
    (config: a training run's memory timeline) and this code's version. None while the run is running."""
    if run.get("status") in (None, "running") or not run.get("ended_at"):
        return None
    config = hashlib.sha256(json.dumps(run.get("config"), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"v{_ANALYSES_VERSION}:{run.get('events')}:{run.get('ended_at')}:{config}"


def advise(run_id: str, store=None, rules: list | None = None) -> list[Advice]:
    """Ranked recommendations for a run, biggest estimated gain first."""
    return report(run_id, store, rules)[1]
