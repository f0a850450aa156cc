"""The small, safe expression language of rule files.

    fallback.seconds > 0.1 * time.seconds and hw.kind in ["npu", "gpu"]
    item.seconds + item.transfer_seconds - item.native_seconds

Expressions are parsed with Python's `ast` and checked against a whitelist of node types:
comparisons, arithmetic, and/or/not, literals, lists, dotted names that look up keys of the
analysis dict, and a few pure functions (min, max, abs, len, round, ms, pct, size). Nothing is
ever passed to `eval`: a rule file is data, even one that came from someone else.
"""
from __future__ import annotations

import ast
import operator as op

_BIN = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv, ast.FloorDiv: op.floordiv,
        ast.Mod: op.mod, ast.Pow: op.pow}
_UNARY = {ast.USub: op.neg, ast.UAdd: op.pos, ast.Not: op.not_}
_CMP = {ast.Eq: op.eq, ast.NotEq: op.ne, ast.Lt: op.lt, ast.LtE: op.le, ast.Gt: op.gt, ast.GtE: op.ge,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _size(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(s) -> str:
    s = float(s)
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


FUNCTIONS = {
    "min": min, "max": max, "abs": abs, "len": len, "round": round,
    "ms": _ms,                                   # seconds -> "1.23 ms"
    "pct": lambda x: f"{100 * float(x):.1f}%",   # fraction -> "12.3%"
    "size": _size,                               # bytes -> "4.0 MiB"
    "join": lambda xs, sep=", ": sep.join(str(x) for x in xs),
}


class ExprError(ValueError):
    """A malformed expression, or a name the analyses do not have."""


class Expr:
    """A checked expression; `evaluate(namespace)` looks names up in nested dicts."""

    def __init__(self, text: str, roots: set[str] | None = None):
        self.text = text
        if not isinstance(text, str) or not text.strip():
            raise ExprError("expected a non-empty expression string")
        try:
            self.tree = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise ExprError(f"cannot parse {text!r} ({e.msg})") from None
        self.names = set()
        _check(self.tree, self.names)
        if roots is not None:
            unknown = sorted(n for n in self.names if n not in roots)
            if unknown:
                raise ExprError(f"unknown name {unknown[0]!r} in {text!r}; known are {', '.join(sorted(roots))}")

    def evaluate(self, ns: dict):
        return _eval(self.tree, ns, self.text)

    def __repr__(self):
        return f"Expr({self.text!r})"


def _check(node, names: set) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise ExprError(f"literal {node.value!r} is not allowed")
    elif isinstance(node, ast.Name):
        if node.id not in FUNCTIONS and node.id not in ("true", "false"):
            names.add(node.id)
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            raise ExprError(f"name part {node.attr!r} is not allowed")
        _check(node.value, names)
    elif isinstance(node, ast.Subscript):
        _check(node.value, names)
        _check(node.slice, names)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand, names)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, names)
    elif isinstance(node, ast.Compare) and all(type(o) in _CMP for o in node.ops):
        _check(node.left, names)
        for c in node.comparators:
            _check(c, names)
    elif isinstance(node, (ast.List, ast.Tuple)):
        for e in node.elts:
            _check(e, names)
    elif isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check(part, names)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"call to {what!r} is not allowed; functions are {', '.join(FUNCTIONS)}")
        for a in node.args:
            _check(a, names)
    else:
        raise ExprError(f"{type(node).__name__} ({ast.unparse(node)!r}) is not allowed in a rule expression")


def _eval(node, ns, text):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "true":
            return True
        if node.id == "false":
            return False
        if node.id in FUNCTIONS:
            return FUNCTIONS[node.id]
        if node.id not in ns:
            raise ExprError(f"no value {node.id!r} (in {text!r})")
        return ns[node.id]
    if isinstance(node, ast.Attribute):
        base = _eval(node.value, ns, text)
        if isinstance(base, dict) and node.attr in base:
            return base[node.attr]
        raise ExprError(f"no value {ast.unparse(node)!r} (in {text!r})")
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, ns, text)
        key = _eval(node.slice, ns, text)
        try:
            return base[key]
        except (KeyError, IndexError, TypeError):
            raise ExprError(f"no value {ast.unparse(node)!r} (in {text!r})") from None
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, ns, text), _eval(node.right, ns, text)
        try:
            return _BIN[type(node.op)](left, right)
        except ZeroDivisionError:
            return 0.0          # a share of nothing is nothing: rules should not crash on empty runs
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, ns, text))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            v = True
            for e in node.values:
                v = _eval(e, ns, text)
                if not v:
                    return v
            return v
        v = False
        for e in node.values:
            v = _eval(e, ns, text)
            if v:
                return v
        return v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, ns, text)
        for o, c in zip(node.ops, node.comparators):
            right = _eval(c, ns, text)
            if not _CMP[type(o)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.List):
        return [_eval(e, ns, text) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, ns, text) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _eval(node.body, ns, text) if _eval(node.test, ns, text) else _eval(node.orelse, ns, text)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*[_eval(a, ns, text) for a in node.args])
    raise ExprError(f"cannot evaluate {ast.unparse(node)!r}")


class Template:
    """A message: text with `{expression}` or `{expression:format}` fields, e.g.
    "{item.op} fell back on {item.calls} calls ({ms(item.seconds)}, {item.share:.0%})"."""

    def __init__(self, text: str, roots: set[str] | None = None):
        if not isinstance(text, str):
            raise ExprError("expected a string")
        self.text = text
        self.parts: list = []         # str, or (Expr, format_spec)
        i = 0
        buf = []
        while i < len(text):
            ch = text[i]
            if ch == "{" and text.startswith("{{", i):
                buf.append("{")
                i += 2
            elif ch == "}" and text.startswith("}}", i):
                buf.append("}")
                i += 2
            elif ch == "{":
                end = _field_end(text, i)
                field = text[i + 1:end]
                expr, spec = _split_spec(field)
                if buf:
                    self.parts.append("".join(buf))
                    buf = []
                self.parts.append((Expr(expr, roots), spec))
                i = end + 1
            elif ch == "}":
                raise ExprError(f"unmatched '}}' in {text!r}")
            else:
                buf.append(ch)
                i += 1
        if buf:
            self.parts.append("".join(buf))

    @property
    def names(self) -> set:
        return {n for p in self.parts if isinstance(p, tuple) for n in p[0].names}

    def render(self, ns: dict) -> str:
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
                continue
            value = p[0].evaluate(ns)
            if isinstance(value, (list, tuple)) and not p[1]:
                value = ", ".join(str(v) for v in value)
            try:
                out.append(format(value, p[1]))
            except (ValueError, TypeError) as e:
                raise ExprError(f"cannot format {p[0].text!r} with {p[1]!r} ({e})") from None
        return "".join(out)


def _top_level(text, start=0):
    """(index, char) of each character outside quotes and brackets, from `start` on."""
    depth = 0
    quote = None
    for j in range(start, len(text)):
        ch = text[j]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0:
            yield j, ch


def _field_end(text, start):
    for j, ch in _top_level(text, start + 1):
        if ch == "}":
            return j
    raise ExprError(f"unclosed '{{' in {text!r}")


def _split_spec(field):
    """'x.y:.2f' -> ('x.y', '.2f'): the last ':' outside brackets and quotes starts the spec."""
    cut = max((j for j, ch in _top_level(field) if ch == ":"), default=-1)
    if cut < 0:
        return field, ""
    return field[:cut], field[cut + 1:]
