"""Rule packs: advice as data.

A pack is a TOML file of rules; each rule says when it fires (a condition over the analyses),
what it says (message templates with the evidence), how much it should gain (an expression, in
seconds per step) and where it applies (hardware kinds or backend names):

    [pack]
    applies_to = ["npu"]                 # default for the pack's rules; "*" means every backend

    [[rule]]
    id = "implement-fallback-op"
    title = "Implement {item.op} natively on {run.backend}"
    for_each = "fallback.ops"            # one piece of advice per list item, bound to `item`
    condition = "item.gain_seconds > 0"
    gain = "item.gain_seconds"
    message = "{item.op} fell back to {item.backend} on {item.calls} calls ..."
    evidence = { seconds = "item.seconds", transfer_bytes = "item.transfer_bytes", nodes = "item.nodes" }
    severity = "high"                    # high | medium | low | info
    apply = { kind = "dtype", dtype = "{hw.fast_dtype}" }   # what `advise --apply` changes

Expressions use the language in expr.py (never `eval`). Every mistake in a pack -- TOML syntax,
an unknown key, a bad expression, a missing field -- is one line naming the file and the rule.
A pack is data people share, so it is bounded too: its size, its rules, each rule's tables, and
(expr.py) every expression's size, depth, numbers, strings, format specs and time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from opscope.runtime.errors import UsageError

from .analyses import SECTIONS
from .expr import Expr, ExprError, Template

BUNDLED = Path(__file__).resolve().parent.parent / "rules"
PACKS = ("generic", "cpu", "gpu", "npu")
SEVERITIES = ("high", "medium", "low", "info")
APPLY_KINDS = ("dtype", "backend", "batch", "passes", "ratios", "none")
MAX_PACK_BYTES = 1024 * 1024      # a pack is data people share: bounded, like the expressions in it (expr.py)
MAX_RULES = 500                   # rules in one pack
MAX_ENTRIES = 64                  # names in one rule's evidence or apply table

# key -> (required, what it is)
RULE_KEYS = {
    "id": (True, "a unique rule id, e.g. \"use-float16\""),
    "title": (True, "a one-line title template"),
    "message": (True, "a message template with {expression} fields"),
    "condition": (True, "an expression over the analyses that is true when the rule fires"),
    "gain": (False, "an expression: estimated seconds saved per step"),
    "severity": (False, f"one of {', '.join(SEVERITIES)}"),
    "applies_to": (False, "a list of hardware kinds (cpu, gpu, npu) or backend names, or [\"*\"]"),
    "for_each": (False, "a name of a list in the analyses, e.g. \"fallback.ops\""),
    "limit": (False, "the most advice items a for_each rule gives"),
    "evidence": (False, "a table of name = expression"),
    "apply": (False, "a table: kind = dtype|backend|batch|passes|ratios|none, and its settings as templates"),
    "doc": (False, "a longer explanation"),
}
PACK_KEYS = {"name", "summary", "applies_to"}


@dataclass
class Rule:
    id: str
    title: Template
    message: Template
    condition: Expr
    gain: Expr | None = None
    severity: str = "medium"
    applies_to: list = field(default_factory=lambda: ["*"])
    for_each: Expr | None = None
    limit: int = 0
    evidence: dict = field(default_factory=dict)       # name -> Expr
    apply: dict = field(default_factory=dict)          # key -> Template
    doc: str = ""
    path: str = ""

    def where(self) -> str:
        return f"{self.path}: rule {self.id!r}"

    @property
    def bundled(self) -> bool:
        """One of opscope's own packs (profiler/rules/), not a file the user gave."""
        return bool(self.path) and Path(self.path).resolve().parent == BUNDLED

    def matches(self, kind: str, backend: str) -> bool:
        for a in self.applies_to:
            if a == "*" or a == kind or a == backend or (a.endswith("*") and backend.startswith(a[:-1])):
                return True
        return False


def bundled_paths() -> list[Path]:
    return [BUNDLED / f"{name}.toml" for name in PACKS if (BUNDLED / f"{name}.toml").is_file()]


def load_rules(extra: list[str | Path] = (), *, bundled: bool = True) -> list[Rule]:
    """The bundled packs, then the user's files; a later rule with the same id replaces the earlier."""
    rules: dict[str, Rule] = {}
    for path in (bundled_paths() if bundled else []) + [Path(p) for p in extra]:
        for r in load_pack(path):
            rules[r.id] = r
    return list(rules.values())


def load_pack(path: str | Path) -> list[Rule]:
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise UsageError(f"rule file {path} {what}: give a path to a .toml rule pack")
    with open(path, "rb") as f:
        raw = f.read(MAX_PACK_BYTES + 1)
    if len(raw) > MAX_PACK_BYTES:
        raise UsageError(f"{path}: a rule pack is at most {MAX_PACK_BYTES // 1024} KiB; this one is bigger")
    text = raw.decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        rule = _rule_near_error(text, str(e))
        raise UsageError(f"{path}: {'rule ' + repr(rule) + ': ' if rule else ''}not valid TOML ({e})") from None
    except (RecursionError, MemoryError):
        raise UsageError(f"{path}: not valid TOML (arrays or tables nested too deeply)") from None
    for key in data:
        if key not in ("pack", "rule"):
            raise UsageError(f"{path}: unknown top-level key {key!r}; a rule pack has [pack] and [[rule]] tables")
    pack = data.get("pack", {})
    if not isinstance(pack, dict):
        raise UsageError(f"{path}: pack: expected a table")
    for key in pack:
        if key not in PACK_KEYS:
            raise UsageError(f"{path}: pack.{key}: unknown key; expected one of {', '.join(sorted(PACK_KEYS))}")
    default_applies = _applies(pack.get("applies_to", ["*"]), f"{path}: pack.applies_to")
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise UsageError(f"{path}: rule: expected [[rule]] tables")
    if len(raw_rules) > MAX_RULES:
        raise UsageError(f"{path}: {len(raw_rules)} rules; a pack holds at most {MAX_RULES}")
    out, seen = [], set()
    for i, raw in enumerate(raw_rules):
        r = _parse_rule(raw, path, i, default_applies)
        if r.id in seen:
            raise UsageError(f"{r.where()}: the id is used twice in this file; rule ids must be unique")
        seen.add(r.id)
        out.append(r)
    return out


def _rule_near_error(text: str, message: str) -> str | None:
    """The id of the rule a TOML syntax error sits in: the last `id = "..."` before its line."""
    m = re.search(r"line (\d+)", message)
    if not m:
        return None
    lines = text.splitlines()[: int(m.group(1))]
    for line in reversed(lines):
        hit = re.match(r"\s*id\s*=\s*[\"']([^\"']+)[\"']", line)
        if hit:
            return hit.group(1)
        if line.strip() == "[[rule]]" and line is not lines[-1]:
            return None
    return None


def _applies(value, where) -> list:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: expected {RULE_KEYS['applies_to'][1]}, got {value!r}")
    return value


def _parse_rule(raw, path: Path, index: int, default_applies: list) -> Rule:
    rid = raw.get("id") if isinstance(raw, dict) else None
    where = f"{path}: rule {rid!r}" if isinstance(rid, str) else f"{path}: rule #{index + 1}"
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a table")
    for key in raw:
        if key not in RULE_KEYS:
            raise UsageError(f"{where}: unknown key {key!r}; expected one of {', '.join(RULE_KEYS)}")
    for key, (required, what) in RULE_KEYS.items():
        if required and key not in raw:
            raise UsageError(f"{where}: missing {key!r} ({what})")
    if not isinstance(rid, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", rid):
        raise UsageError(f"{where}: id: expected {RULE_KEYS['id'][1]} (letters, digits, - _ .), got {rid!r}")
    roots = set(SECTIONS) | ({"item"} if "for_each" in raw else set())

    def expr(key, value, cls=Expr):
        if not isinstance(value, str):
            raise UsageError(f"{where}: {key}: expected a string ({RULE_KEYS.get(key.split('.')[0], (0, ''))[1]}), "
                             f"got {type(value).__name__} {value!r}")
        try:
            return cls(value, roots, where=key)
        except ExprError as e:
            raise UsageError(f"{where}: {key}: {e}") from None

    severity = raw.get("severity", "medium")
    if severity not in SEVERITIES:
        raise UsageError(f"{where}: severity: expected one of {', '.join(SEVERITIES)}, got {severity!r}")
    limit = raw.get("limit", 0)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UsageError(f"{where}: limit: expected a non-negative integer, got {limit!r}")
    for key in ("evidence", "apply"):
        if key in raw and not isinstance(raw[key], dict):
            raise UsageError(f"{where}: {key}: expected a table ({RULE_KEYS[key][1]})")
        if len(raw.get(key, {})) > MAX_ENTRIES:
            raise UsageError(f"{where}: {key}: {len(raw[key])} entries; at most {MAX_ENTRIES}")
    apply = {k: expr(f"apply.{k}", v, Template) for k, v in raw.get("apply", {}).items()}
    if apply:
        kind = raw["apply"].get("kind")
        if kind not in APPLY_KINDS:
            raise UsageError(f"{where}: apply.kind: expected one of {', '.join(APPLY_KINDS)}, got {kind!r}")
    doc = raw.get("doc", "")
    if not isinstance(doc, str):
        raise UsageError(f"{where}: doc: expected a string")
    return Rule(
        id=rid, title=expr("title", raw["title"], Template), message=expr("message", raw["message"], Template),
        condition=expr("condition", raw["condition"]), gain=expr("gain", raw["gain"]) if "gain" in raw else None,
        severity=severity, applies_to=_applies(raw.get("applies_to", default_applies), f"{where}: applies_to"),
        for_each=expr("for_each", raw["for_each"]) if "for_each" in raw else None, limit=limit,
        evidence={k: expr(f"evidence.{k}", v) for k, v in raw.get("evidence", {}).items()},
        apply=apply, doc=doc, path=str(path))
