"""Breakpoints: where (op type, node name or module path glob) and when (a condition on the output).

    linear                  every linear op (any name the op registry knows)
    op:matmul               the same, explicit
    layers.0.*              node name or module path, as a glob
    node:linear_1           one node
    nan | inf               the output holds a NaN / an Inf
    new-nan                 this op makes a NaN/Inf: its output holds one and no input an earlier
                            op made does (a parameter or a model input may); --break-on-nan, `e`
    tolerance               this op introduces more error than the tolerance (needs --reference)
    introduced              this op adds more error than rounding to its dtype explains, under
                            tolerance too: where error that fails later began (needs --reference)
    max_abs > 1e4           a statistic of the output (max_abs, min, max, mean, std)
    err > 1e-3              error against the reference (needs --reference): total error,
    local > 1e-3            or the error this op introduces on its own (same inputs)
    layers.* if nan         a place and a condition together
"""
from __future__ import annotations

import difflib
import fnmatch
import operator as _operator
import re
from dataclasses import dataclass

from opscope.runtime.errors import UsageError
from opscope.runtime.ops import OPS

_CMP = {">": _operator.gt, ">=": _operator.ge, "<": _operator.lt, "<=": _operator.le}
_COND = re.compile(r"^(max_abs|min|max|mean|std|err|local)\s*(>=|<=|>|<)\s*([-+0-9.eE]+|inf)$")
_WORDS = ("nan", "inf", "new-nan", "tolerance", "introduced")
STATS = frozenset(("max_abs", "min", "max", "mean", "std"))


@dataclass
class Breakpoint:
    spec: str
    op: str | None = None           # op type
    glob: str | None = None         # node name or module path
    cond: str | None = None         # "nan", "inf" or "<key> <cmp> <number>"
    enabled: bool = True
    hits: int = 0
    builtin: bool = False           # added by a flag (tolerance): shown, toggled, not typed by the user

    # --- what it needs evaluated -------------------------------------------------------
    @property
    def key(self) -> str | None:
        if self.cond in _WORDS:
            return self.cond
        return self.cond.split()[0] if self.cond else None

    def matches_place(self, node) -> bool:
        if self.op is not None and node.op != self.op:
            return False
        if self.glob is not None and not (fnmatch.fnmatchcase(node.name, self.glob)
                                          or fnmatch.fnmatchcase(node.module_path or "", self.glob)):
            return False
        return True

    def matches(self, node, facts: dict) -> bool:
        """`facts` holds nan, inf, the STATS and, with a reference, err and local."""
        if not self.enabled or not self.matches_place(node):
            return False
        if self.cond is None:
            return True
        if self.cond in _WORDS:
            return bool(facts.get(self.cond))
        key, cmp, num = self.cond.split()
        value = facts.get(key)
        return value is not None and _CMP[cmp](value, float(num))

    def describe(self) -> str:
        if self.builtin:
            return self.spec
        parts = []
        if self.op:
            parts.append(f"op {self.op}")
        if self.glob:
            parts.append(f"at {self.glob}")
        if self.cond:
            parts.append(f"if {self.cond}")
        return " ".join(parts) or self.spec


def parse(spec: str) -> Breakpoint:
    text = " ".join(spec.split())
    if not text:
        raise UsageError("empty breakpoint: give an op type (linear), a path glob (layers.0.*) or a condition (nan)")
    where, _, cond = text.partition(" if ")
    if not cond and _is_cond(where):
        where, cond = "", where
    bp = Breakpoint(spec=text)
    if cond:
        bp.cond = _parse_cond(cond, spec)
    if where:
        if any(c in where for c in " <>=!()"):
            raise UsageError(f"breakpoint {spec!r}: {where!r} is neither a place nor a condition; use an op type "
                             "(linear), a path glob (layers.0.*), a condition (nan, max_abs > 1e4) or 'GLOB if COND'")
        if where.startswith("op:"):
            bp.op = where[3:]
            if bp.op not in OPS and bp.op != "transfer":
                raise UsageError(f"breakpoint {spec!r}: unknown op {bp.op!r}; op names are short and lower-case "
                                 "(linear, matmul, layer_norm)")
        elif where.startswith(("node:", "path:")):
            bp.glob = where.split(":", 1)[1]
        elif where in OPS or where == "transfer":
            bp.op = where
        else:
            bp.glob = where
    return bp


def _is_cond(text: str) -> bool:
    return text in _WORDS or bool(_COND.match(text))


def _parse_cond(cond: str, spec: str) -> str:
    cond = cond.strip()
    if cond in _WORDS:
        return cond
    m = _COND.match(cond)
    if not m:
        raise UsageError(f"breakpoint {spec!r}: condition {cond!r} not understood; use nan, inf, new-nan, tolerance, "
                         "introduced, or KEY > NUMBER with KEY one of max_abs, min, max, mean, std, err, local")
    return f"{m.group(1)} {m.group(2)} {float(m.group(3))!r}"


def dead(bp: Breakpoint, nodes) -> str | None:
    """Why a breakpoint's place matches no op of this graph, with the nearest real names; None if it matches."""
    if bp.builtin or (bp.op is None and bp.glob is None):
        return None
    if any(bp.matches_place(n) for n in nodes):
        return None
    if bp.op is not None and bp.glob is None:
        ops = sorted({n.op for n in nodes})
        near = difflib.get_close_matches(bp.op, ops, n=3, cutoff=0.5)
        return (f"breakpoint {bp.spec!r}: this model has no {bp.op} op"
                + (f"; did you mean {', '.join(near)}?" if near else f" (its ops: {', '.join(ops[:12])})"))
    names = sorted({n.name for n in nodes} | {n.op for n in nodes}
                   | {p for n in nodes if n.module_path for p in _prefixes(n.module_path)})
    pattern = bp.glob or ""
    bare = pattern.strip("*").rstrip(".")
    near = difflib.get_close_matches(bare, names, n=3, cutoff=0.6)
    # `h.1.*` on a model whose paths are `transformer.h.1.attn`: the glob needs a leading `*`
    inner = [p for p in names if bare and ("." + bare) in ("." + p) and not p.startswith(bare)]
    if inner:
        near = [f"*{pattern}" if not pattern.startswith("*") else pattern] + [inner[0] + (".*" if "*" in pattern else "")]
    where = f"{bp.spec!r}" if bp.op is None else f"{bp.spec!r} (op {bp.op} at {pattern})"
    return (f"breakpoint {where} matches no op: no node name or module path is like {pattern!r}"
            + (f"; did you mean {' or '.join(dict.fromkeys(near))}?" if near else ""))


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


class Breakpoints:
    """The list the UI shows; the controller asks it after every op."""

    def __init__(self, items=()):
        self.items: list[Breakpoint] = list(items)

    def add(self, spec: str | Breakpoint) -> Breakpoint:
        bp = parse(spec) if isinstance(spec, str) else spec
        self.items.append(bp)
        return bp

    def on_node(self, node) -> Breakpoint | None:
        """The plain breakpoint on exactly this node (what `b` sets and the graph marks), if any."""
        return next((bp for bp in self.items if bp.glob == node.name and bp.op is None and bp.cond is None), None)

    def toggle_node(self, node) -> Breakpoint | None:
        """`b` on an op: add a breakpoint on that node, or remove the one that is there."""
        bp = self.on_node(node)
        if bp is not None:
            self.items.remove(bp)
            return None
        return self.add(Breakpoint(spec=f"node:{node.name}", glob=node.name))

    def remove(self, index: int) -> Breakpoint:
        return self.items.pop(index)

    def dead(self, nodes) -> list[str]:
        """A message per breakpoint that can never stop in this graph (a misspelt op, a glob that matches nothing)."""
        return [m for m in (dead(bp, nodes) for bp in self.items) if m]

    def needs(self) -> set[str]:
        """Which facts some enabled breakpoint looks at (the controller computes only those)."""
        return {bp.key for bp in self.items if bp.enabled and bp.key}

    def hit(self, node, facts: dict) -> Breakpoint | None:
        for bp in self.items:
            if bp.matches(node, facts):
                bp.hits += 1
                return bp
        return None

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)
