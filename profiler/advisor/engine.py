"""The rule engine: analyses + rules -> ranked Advice."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from opscope.runtime.errors import UsageError

from . import expr
from .expr import ExprError, budget
from .rules import SEVERITIES, Rule

_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class Advice:
    """One recommendation: what to change, why (the evidence), how much it should gain, how to apply it."""

    id: str                        # rule id, plus the item (`implement-fallback-op:gelu`)
    rule: str
    title: str
    message: str
    evidence: dict = field(default_factory=dict)
    estimated_gain: dict = field(default_factory=dict)     # {"seconds": s per step, "fraction": of the step}
    severity: str = "medium"
    applies_to: list = field(default_factory=list)
    apply: dict | None = None      # what `advise --apply` changes, or None when it cannot be applied

    def as_dict(self) -> dict:
        return asdict(self)


# what evaluating a checked rule over analyses can raise: the language's own errors, and Python's for values
# of a type or size the rule did not expect (a name 2 MB long, a list that is a number)
RULE_ERRORS = (ExprError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError)


def evaluate(rules: list[Rule], analyses: dict, skipped: list | None = None) -> list[Advice]:
    """Every rule that applies to the run's backend and whose condition holds; biggest gain first.

    A rule that fails on this run: a bundled rule is opscope's own and tested, so what broke it is the run's
    data (an imported trace's) -- it is skipped and `skipped` gets {rule, file, reason}, the other rules still
    advise. A rule from the user's pack is their input: one line naming the file and the rule (exit 2)."""
    kind, backend = analyses["hw"]["kind"], analyses["run"]["backend"] or ""
    base = analyses["time"]["seconds"]
    out: list[Advice] = []
    # NOTE: a time budget per rule (however many items its for_each has), inside one for the whole pack
    with budget(20.0, "all rules of one advise"):
        for rule in rules:
            if not rule.matches(kind, backend):
                continue
            try:
                with budget(expr.SECONDS, "one rule"):
                    out.extend(_fire(rule, analyses, base))
            except RULE_ERRORS as e:
                if not rule.bundled:
                    raise UsageError(f"{rule.where()}: {_one_line(e)}") from None
                if skipped is not None:
                    skipped.append({"rule": rule.id, "file": rule.path, "reason": _one_line(e)})
    out.sort(key=lambda a: (-a.estimated_gain["seconds"], _SEVERITY_RANK.get(a.severity, 9), a.id))
    return out


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fire(rule: Rule, analyses: dict, base: float) -> list[Advice]:
    if rule.for_each is None:
        scopes = [(None, analyses)]
    else:
        items = rule.for_each.evaluate(analyses)
        if not isinstance(items, list):
            raise ExprError(f"for_each {rule.for_each.text!r} is not a list")
        scopes = [(item, {**analyses, "item": item}) for item in items]
    out = []
    for item, ns in scopes:
        if not rule.condition.evaluate(ns):
            continue
        gain = float(rule.gain.evaluate(ns)) if rule.gain is not None else 0.0
        gain = max(gain, 0.0)
        evidence = {k: e.evaluate(ns) for k, e in rule.evidence.items()}
        # NOTE: no change can save more than the measured step: a rule (a user's too) whose estimate says so is
        # capped, and its evidence says by how much, instead of printing a gain above 100 %
        if base > 0 and gain > base:
            evidence["gain_capped_from_seconds"] = gain
            gain = base
        apply = {k: t.render(ns) for k, t in rule.apply.items()} or None
        if apply is not None and apply.get("kind") == "none":
            apply = None
        out.append(Advice(id=rule.id + (f":{_item_key(item, len(out))}" if item is not None else ""), rule=rule.id,
                          title=rule.title.render(ns), message=rule.message.render(ns), evidence=evidence,
                          estimated_gain={"seconds": gain, "fraction": gain / base if base > 0 else 0.0},  # 0..1
                          severity=rule.severity, applies_to=list(rule.applies_to), apply=apply))
        if rule.limit and len(out) >= rule.limit:
            break
    return out


def _item_key(item, index) -> str:
    if isinstance(item, dict):
        for k in ("op", "backend", "node", "name"):
            if isinstance(item.get(k), str) and item[k]:
                return item[k]
    if isinstance(item, str):
        return item
    return str(index)
