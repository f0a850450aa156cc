"""Alert rules as data (TOML), in the advisor's bounded expression language.

    [[alert]]
    id = "hot-chip"
    metric = "temperature"            # the sample a rule watches (see METRICS)
    condition = "value > device.throttle_temperature - 5"
    duration = 10                     # seconds the condition must hold before the alert fires
    severity = "warning"              # info | warning | critical
    message = "{device.name} at {value:.0f} C for {duration:g} s"   # fields only: see FIELDS

    rules = load_rules(["my-rules.toml"])        # the bundled default.toml first, then the files
    engine = AlertEngine(rules)
    alerts = engine.observe(t, "sim:hot", {"temperature": 93.0, ...}, device={...})

A condition and a message see: `value` (the metric's value), `sample` (every metric of that
device at that moment), `device` (name, kind, and the description's thermal/power numbers),
`duration` / `held` (seconds the condition has held), and `median` / `over_median` (a rank's
median step time, and how far above it this rank is, as a fraction). A condition is an expression;
a message only substitutes fields: `{name}` or `{name:spec}` of a name in FIELDS, or `ms()`, `pct()`,
`size()` of one, never arithmetic, indexing or other attributes (`{value / 'x'}` raised a TypeError
while the alert fired; now the file is refused when it is read). Nothing in a rule file is executed.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from opscope.profiler.advisor.expr import Expr, ExprError, Template, budget
from opscope.runtime.errors import UsageError, first_line
from opscope.runtime.safe_read import read_bounded

METRICS = {
    "temperature": "degrees C (sim chips' thermal model; host sensors where psutil has them)",
    "power": "watts (sim chips' thermal model; NVML where present)",
    "utilization": "busy fraction 0..1 (host CPU %, sim chips' load)",
    "memory": "used fraction 0..1 of the device's memory",
    "rank_step_seconds": "a rank's step time in a live multi-rank run (`median` is the ranks' median)",
    "dropped_events": "events the run lost on the way",
}
SEVERITIES = ("info", "warning", "critical")
KEYS = {"id": str, "metric": str, "condition": str, "duration": (int, float), "severity": str, "message": str}
ROOTS = {"value", "sample", "device", "duration", "held", "median", "over_median"}
DEVICE_KEYS = ("name", "kind", "tdp", "throttle_temperature")      # what every source's `device` holds
FIELDS = ({"value", "duration", "held", "median", "over_median"} | {f"device.{k}" for k in DEVICE_KEYS}
          | {f"sample.{m}" for m in METRICS})
FORMATTERS = ("ms", "pct", "size")          # the expression language's pure formatting functions
_FIELD = re.compile(r"(?:(?:%s)\((?P<inner>[\w.]+)\)|(?P<name>[\w.]+))" % "|".join(FORMATTERS))
BUNDLED = Path(__file__).with_name("default.toml")
MAX_BYTES = 1 << 20


@dataclass
class AlertRule:
    id: str
    metric: str
    condition: Expr
    duration: float
    severity: str
    message: Template
    source: str = ""


def load_rules(files=(), *, bundled: bool = True) -> list[AlertRule]:
    rules = load_file(BUNDLED) if bundled else []
    for f in files:
        rules += load_file(Path(f))
    seen = {}
    for r in rules:                       # a later file's rule with the same id replaces the earlier one
        seen[r.id] = r
    return list(seen.values())


def load_file(path: Path) -> list[AlertRule]:
    if not path.is_file():
        raise UsageError(f"alert rules {path} {'is not a file' if path.exists() else 'does not exist'}")
    # the bounded reader: the size before the bytes (read_bytes() read a 10 GB file whole before cutting it)
    raw = read_bounded(path, MAX_BYTES, f"alert rules {path}", "alert rules are a short TOML file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise UsageError(f"{path}: not valid TOML ({first_line(e)})")
    unknown = [k for k in data if k != "alert"]
    if unknown or not isinstance(data.get("alert", []), list):
        raise UsageError(f"{path}: expected [[alert]] tables only, got {unknown[0] if unknown else 'alert = ...'}")
    return [_rule(path, i, body) for i, body in enumerate(data.get("alert", []))]


def _rule(path: Path, i: int, body) -> AlertRule:
    where = f"{path}: alert {i + 1}"
    if not isinstance(body, dict):
        raise UsageError(f"{where}: expected a table")
    if isinstance(body.get("id"), str):
        where = f"{path}: alert {body['id']!r}"
    for key, value in body.items():
        if key not in KEYS:
            raise UsageError(f"{where}: unknown key {key!r}; expected {', '.join(KEYS)}")
        if isinstance(value, bool) or not isinstance(value, KEYS[key]):
            raise UsageError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    for key in ("id", "metric", "condition", "message"):
        if key not in body:
            raise UsageError(f"{where}: {key} is missing")
    if body["metric"] not in METRICS:
        raise UsageError(f"{where}: unknown metric {body['metric']!r}; known are {', '.join(METRICS)}")
    severity = body.get("severity", "warning")
    if severity not in SEVERITIES:
        raise UsageError(f"{where}: severity {severity!r}; use {', '.join(SEVERITIES)}")
    duration = float(body.get("duration", 0))
    if not 0 <= duration <= 86400:
        raise UsageError(f"{where}: duration must be 0..86400 seconds (got {duration})")
    _check_fields(body["message"], where)
    try:
        cond = Expr(body["condition"], ROOTS, where=f"{where}: condition")
        msg = Template(body["message"], ROOTS, where=f"{where}: message")
    except ExprError as e:
        raise UsageError(str(e) if str(e).startswith(str(path)) else f"{where}: {e}")
    return AlertRule(body["id"], body["metric"], cond, duration, severity, msg, str(path))


def _check_fields(message: str, where: str) -> None:
    """A message substitutes known fields and nothing else, checked before anything runs: a field that
    computes (`{value / 'x'}`), indexes or reaches for an attribute (`{x.__class__}`) is refused."""
    try:
        fields = [(f, conv, spec) for _, f, spec, conv in string.Formatter().parse(message) if f is not None]
    except ValueError as e:
        raise UsageError(f"{where}: message: {e}; write a literal brace as {{{{ or }}}}")
    for f, conv, spec in fields:
        m = _FIELD.fullmatch(f)
        name = m and (m["inner"] or m["name"])
        if name not in FIELDS or conv is not None or "{" in (spec or ""):
            shown = f"{{{f}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
            raise UsageError(f"{where}: message field {shown[:80]!r} is not allowed: a message substitutes "
                             f"{{name}} or {{name:spec}}, or ms/pct/size of one, for a name among value, duration, "
                             f"held, median, over_median, device.{'/'.join(DEVICE_KEYS)}, sample.METRIC")


@dataclass
class _Episode:
    since: float
    fired: bool = False


@dataclass
class AlertEngine:
    """Holds each (rule, subject) condition's start time; an alert fires once per episode, when the
    condition has held for the rule's duration, and re-arms when the condition stops holding."""

    rules: list[AlertRule]
    episodes: dict = field(default_factory=dict)
    alerts: list[dict] = field(default_factory=list)

    def observe(self, t: float, subject: str, sample: dict, device: dict | None = None,
                extra: dict | None = None) -> list[dict]:
        fired = []
        for rule in self.rules:
            if sample.get(rule.metric) is None:
                continue
            key = (rule.id, subject)
            ns = {"value": sample[rule.metric], "sample": sample, "device": device or {"name": subject},
                  "duration": rule.duration, "held": 0.0, "median": 0.0, **(extra or {})}
            ns["over_median"] = ns["value"] / ns["median"] - 1 if _number(ns["value"]) and _number(ns["median"]) \
                and ns["median"] else 0.0
            try:
                with budget(what=f"alert {rule.id}"):
                    holds = bool(rule.condition.evaluate(ns))
            except ExprError as e:
                raise UsageError(f"{rule.source}: alert {rule.id!r}: {e}")
            if not holds:
                self.episodes.pop(key, None)
                continue
            ep = self.episodes.setdefault(key, _Episode(t))
            ns["held"] = t - ep.since
            if ep.fired or ns["held"] < rule.duration:
                continue
            ep.fired = True
            try:        # fields are checked at load; a device without one of them still ends in one line
                with budget(what=f"alert {rule.id}"):
                    message = rule.message.render(ns)
            except ExprError as e:
                raise UsageError(f"{rule.source}: alert {rule.id!r}: message: {e}")
            alert = {"kind": "alert", "rule": rule.id, "severity": rule.severity, "metric": rule.metric,
                     "subject": subject, "value": sample[rule.metric], "held_seconds": round(ns["held"], 3),
                     "time": t, "message": message}
            fired.append(alert)
        self.alerts += fired
        return fired


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
