"""The small, safe expression language of rule files (and, extended, of debugger watches).

    fallback.seconds > 0.1 * time.seconds and hw.kind in ["npu", "gpu"]
    item.seconds + item.transfer_seconds - item.native_seconds

Expressions are parsed with Python's `ast` and checked against a whitelist of node types:
comparisons, arithmetic, and/or/not, literals, lists, dotted names that look up keys of the
analysis dict, and a few pure functions (min, max, abs, len, round, ms, pct, size, join). Nothing
is ever passed to `eval`: a rule file is data, even one that came from someone else.

Data from someone else must not hang or crash the tool either, so the language has bounds:

    MAX_TEXT characters per expression and MAX_DEPTH levels of nesting (checked before evaluating)
    ints of at most MAX_INT_BITS bits (`**` is refused before it computes a bigger one)
    strings and lists of at most MAX_ITEMS characters / elements, counted through nested lists
    format specs with width and precision up to MAX_FORMAT; round() to at most MAX_ROUND digits
    float arithmetic that overflows to inf is an error; no complex numbers, no %-formatting
    a time budget: `with budget(seconds):` shares one deadline among the evaluations inside it
    (the engine gives each rule one); outside it, every evaluation gets SECONDS of its own

Every failure -- a bound, a missing name, a wrong type -- is an ExprError (a ValueError), never
a RecursionError, MemoryError or OverflowError. A `Language` adds functions, methods and
attributes to the core (the debugger's watches add tensor methods and a few numpy functions).
"""
from __future__ import annotations

import ast
import math
import operator as op
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable

MAX_TEXT = 10_000
MAX_DEPTH = 100
MAX_INT_BITS = 1000            # ~1e301: every int still converts to a float
MAX_ITEMS = 100_000
MAX_FORMAT = 100
MAX_ROUND = 100
SECONDS = 2.0

_BIN = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv, ast.FloorDiv: op.floordiv,
        ast.Mod: op.mod, ast.Pow: op.pow}
_UNARY = {ast.USub: op.neg, ast.UAdd: op.pos, ast.Not: op.not_}
_CMP = {ast.Eq: op.eq, ast.NotEq: op.ne, ast.Lt: op.lt, ast.LtE: op.le, ast.Gt: op.gt, ast.GtE: op.ge,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_SEQ = (str, list, tuple)


class ExprError(ValueError):
    """A malformed expression, a name the analyses do not have, or a bound it went past.

    `kind` names the Python error behind it where there is one (IndexError, NameError, ...)."""

    def __init__(self, message: str, kind: str = "ExprError"):
        super().__init__(message)
        self.kind = kind


# --- bounds -------------------------------------------------------------------------------------

class Budget:
    """A deadline shared by the evaluations under one `budget()`; checked at every node."""

    def __init__(self, seconds: float, what: str, outer: Budget | None = None):
        self.seconds, self.what = seconds, what
        self.deadline = time.monotonic() + seconds
        if outer is not None and outer.deadline < self.deadline:
            self.deadline, self.seconds, self.what = outer.deadline, outer.seconds, outer.what

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ExprError(f"ran past the {self.seconds:g} s time budget of {self.what}", "TimeoutError")


_BUDGET: ContextVar[Budget | None] = ContextVar("opscope_expr_budget", default=None)


@contextmanager
def budget(seconds: float = SECONDS, what: str = "one rule"):
    """Evaluations inside share one deadline (nested budgets end at the earlier of the two)."""
    token = _BUDGET.set(Budget(seconds, what, _BUDGET.get()))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def _weight(v, limit: int = MAX_ITEMS) -> int:
    """Characters and elements in v, counted through nested lists; stops counting past `limit`."""
    total, stack = 0, [v]
    while stack and total <= limit:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x)
        elif isinstance(x, (list, tuple, dict)):
            total += len(x)
            if total <= limit:
                stack.extend(x.values() if isinstance(x, dict) else x)
    return total


def bounded(v):
    """v, or an ExprError when it is past the language's bounds (ints, strings, lists)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        if v.bit_length() > MAX_INT_BITS:
            raise ExprError(f"a number past {MAX_INT_BITS} bits (about 1e{int(MAX_INT_BITS * 0.30103)})",
                            "OverflowError")
    elif isinstance(v, complex):
        raise ExprError("the result is not a real number")
    elif isinstance(v, (str, list, tuple, dict)) and _weight(v) > MAX_ITEMS:
        raise ExprError(f"a {type(v).__name__} longer than {MAX_ITEMS:,} characters or elements", "MemoryError")
    return v


def _count(v):
    """v as a repeat count when it is one (int, bool, numpy int), else None."""
    if isinstance(v, (float, *_SEQ)):
        return None
    try:
        return op.index(v)
    except TypeError:
        return None


def _check_arith(kind, a, b) -> None:
    """Refuse an operation before it computes something past the bounds (the work is the attack)."""
    if kind is ast.Pow and _count(a) is not None and _count(b) is not None:
        base, exp = abs(_count(a)), _count(b)
        if base > 1 and exp > 0 and (base.bit_length() - 1) * exp > MAX_INT_BITS:
            raise ExprError(f"the power is past {MAX_INT_BITS} bits", "OverflowError")
    elif kind is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, _SEQ) and _count(n) is not None and _weight(seq) * max(_count(n), 0) > MAX_ITEMS:
                raise ExprError(f"repeating a {type(seq).__name__} past {MAX_ITEMS:,} characters or elements",
                                "MemoryError")
        if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
            raise ExprError(f"the product is past {MAX_INT_BITS} bits", "OverflowError")
    elif kind is ast.Mod and isinstance(a, str):
        raise ExprError("%-formatting is not part of the language: use a {field:format} in a message")


def _finite(x) -> bool:
    return not (type(x) is float and not math.isfinite(x))


# --- the rule language's functions ---------------------------------------------------------------

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


def _round(x, ndigits=None):
    # NOTE: round(1, -10**8) computes 10**(10**8) before it answers
    if ndigits is None:
        return round(x)
    if _count(ndigits) is None or abs(_count(ndigits)) > MAX_ROUND:
        raise ExprError(f"round() takes at most {MAX_ROUND} digits, got {str(ndigits)[:20]}")
    return round(x, _count(ndigits))


def _join(xs, sep=", ") -> str:
    parts = [str(x) for x in xs]
    if sum(map(len, parts)) + len(str(sep)) * max(len(parts) - 1, 0) > MAX_ITEMS:
        raise ExprError(f"join() would be longer than {MAX_ITEMS:,} characters", "MemoryError")
    return str(sep).join(parts)


FUNCTIONS = {
    "min": min, "max": max, "abs": abs, "len": len, "round": _round,
    "ms": _ms,                                   # seconds -> "1.23 ms"
    "pct": lambda x: f"{100 * float(x):.1f}%",   # fraction -> "12.3%"
    "size": _size,                               # bytes -> "4.0 MiB"
    "join": _join,                               # list -> "a, b, c"
}


# --- languages -----------------------------------------------------------------------------------

def _dotted(node) -> str | None:
    """'np.linalg.norm' for that chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _show(node) -> str:
    s = ast.unparse(node)
    return s if len(s) <= 60 else s[:57] + "..."


def _lookup(base, key):
    return base[key]


@dataclass(frozen=True)
class Language:
    """What an expression may call and read beyond the core (arithmetic, comparisons, dict keys)."""

    functions: dict                                   # "name" or "np.name" -> callable
    methods: dict = field(default_factory=dict)       # value.name(...) -> callable(value, *args, **kw)
    attribute: Callable | None = None                 # (value, name) -> value, for non-dict values
    keywords: frozenset = frozenset()                 # keyword arguments calls may pass
    slices: bool = False                              # a[1:3], a[..., None]
    operands: Callable | None = None                  # (left, right): refuse before a binary op or compare
    index: Callable = _lookup                         # (base, key) -> base[key], with its own checks

    # --- checking, before anything runs ---------------------------------------------------------

    def check(self, node, names: set) -> None:
        if isinstance(node, ast.Constant):
            v = node.value
            if v is Ellipsis and self.slices:
                return
            if not isinstance(v, (int, float, str, type(None))):
                raise ExprError(f"literal {v!r} is not allowed")
            if isinstance(v, float) and not math.isfinite(v):
                raise ExprError(f"literal {_show(node)} is not a finite number")
            bounded(v)
        elif isinstance(node, ast.Name):
            if node.id in self.functions:
                raise ExprError(f"{node.id!r} is a function: call it, {node.id}(...)")
            if node.id not in ("true", "false"):
                names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise ExprError(f"name part {node.attr!r} is not allowed")
            self.check(node.value, names)
        elif isinstance(node, ast.Subscript):
            self.check(node.value, names)
            self.check(node.slice, names)
        elif isinstance(node, ast.Slice) and self.slices:
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.check(part, names)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            self.check(node.left, names)
            self.check(node.right, names)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            self.check(node.operand, names)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self.check(v, names)
        elif isinstance(node, ast.Compare) and all(type(o) in _CMP for o in node.ops):
            self.check(node.left, names)
            for c in node.comparators:
                self.check(c, names)
        elif isinstance(node, (ast.List, ast.Tuple)):
            for e in node.elts:
                self.check(e, names)
        elif isinstance(node, ast.IfExp):
            for part in (node.test, node.body, node.orelse):
                self.check(part, names)
        elif isinstance(node, ast.Call):
            self._check_call(node, names)
        else:
            raise ExprError(f"{type(node).__name__} ({_show(node)!r}) is not allowed in an expression")

    def _check_call(self, node, names) -> None:
        name = _dotted(node.func)
        if name not in self.functions:
            if not (isinstance(node.func, ast.Attribute) and node.func.attr in self.methods):
                what = f"call to {name or _show(node.func)!r} is not allowed; functions are {', '.join(self.functions)}"
                if self.methods:
                    what += f"; methods are {', '.join(self.methods)}"
                raise ExprError(what)
            self.check(node.func.value, names)
        for k in node.keywords:
            if k.arg is None or k.arg not in self.keywords:
                allowed = f"; allowed are {', '.join(sorted(self.keywords))}" if self.keywords else ""
                raise ExprError(f"keyword argument {k.arg or '**'!r} is not allowed{allowed}")
            self.check(k.value, names)
        for a in node.args:
            self.check(a, names)

    # --- evaluating -------------------------------------------------------------------------------

    def eval(self, node, ns, b: Budget):
        b.tick()
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id == "true":
                return True
            if node.id == "false":
                return False
            if node.id not in ns:
                raise ExprError(f"no value {node.id!r}", "NameError")
            return ns[node.id]
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value, ns, b)
            if isinstance(base, dict):
                if node.attr in base:
                    return base[node.attr]
            elif self.attribute is not None:
                return self.attribute(base, node.attr)
            raise ExprError(f"no value {_show(node)!r}", "AttributeError")
        if isinstance(node, ast.Subscript):
            base, key = self.eval(node.value, ns, b), self.eval(node.slice, ns, b)
            try:
                return self.index(base, key)
            except (KeyError, IndexError, TypeError) as e:
                raise ExprError(f"no value {_show(node)!r}", type(e).__name__) from None
        if isinstance(node, ast.Slice):
            return slice(*(None if p is None else self.eval(p, ns, b) for p in (node.lower, node.upper, node.step)))
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, ns, b), self.eval(node.right, ns, b)
            kind = type(node.op)
            _check_arith(kind, left, right)
            if self.operands is not None:
                self.operands(left, right)
            try:
                v = _BIN[kind](left, right)
            except ZeroDivisionError:
                return 0.0      # a share of nothing is nothing: rules should not crash on empty runs
            except OverflowError:
                raise ExprError(f"{_show(node)!r} overflows a float", "OverflowError") from None
            except (TypeError, ValueError, ArithmeticError) as e:
                raise ExprError(f"cannot compute {_show(node)!r} ({e})", type(e).__name__) from None
            if not _finite(v) and _finite(left) and _finite(right):
                raise ExprError(f"{_show(node)!r} overflows a float", "OverflowError")
            return bounded(v)
        if isinstance(node, ast.UnaryOp):
            return bounded(_UNARY[type(node.op)](self.eval(node.operand, ns, b)))
        if isinstance(node, ast.BoolOp):
            stop_at = not isinstance(node.op, ast.And)     # `and` stops at the first false, `or` at the first true
            v = not stop_at
            for e in node.values:
                v = self.eval(e, ns, b)
                if bool(v) == stop_at:
                    return v
            return v
        if isinstance(node, ast.Compare):
            left = self.eval(node.left, ns, b)
            for o, c in zip(node.ops, node.comparators):
                right = self.eval(c, ns, b)
                if self.operands is not None:
                    self.operands(left, right)
                v = _CMP[type(o)](left, right)
                if len(node.ops) == 1:
                    return v       # as Python: `x > 0` over an array is an array
                if not v:
                    return False
                left = right
            return True
        if isinstance(node, ast.List):
            return bounded([self.eval(e, ns, b) for e in node.elts])
        if isinstance(node, ast.Tuple):
            return bounded(tuple(self.eval(e, ns, b) for e in node.elts))
        if isinstance(node, ast.IfExp):
            return self.eval(node.body, ns, b) if self.eval(node.test, ns, b) else self.eval(node.orelse, ns, b)
        if isinstance(node, ast.Call):
            return self._call(node, ns, b)
        raise ExprError(f"cannot evaluate {_show(node)!r}")

    def _call(self, node, ns, b):
        name = _dotted(node.func)
        if name in self.functions:
            fn = self.functions[name]
        else:
            receiver, name = self.eval(node.func.value, ns, b), node.func.attr
            method = self.methods[name]
            fn = lambda *a, **kw: method(receiver, *a, **kw)  # noqa: E731
        args = [self.eval(a, ns, b) for a in node.args]
        kwargs = {k.arg: self.eval(k.value, ns, b) for k in node.keywords}
        try:
            v = fn(*args, **kwargs)
        except ExprError:
            raise
        except (TypeError, ValueError, ArithmeticError, IndexError, KeyError, AttributeError) as e:
            raise ExprError(f"{name}() failed in {_show(node)!r} ({e})", type(e).__name__) from None
        return bounded(v)


RULES = Language(functions=FUNCTIONS)


# --- expressions and templates -------------------------------------------------------------------

def parse(text: str, language: Language = RULES) -> tuple[ast.AST, set]:
    """The checked tree of `text` and the names it reads; ExprError for anything outside the language."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression string")
    if len(text) > MAX_TEXT:
        raise ExprError(f"an expression of {len(text):,} characters; at most {MAX_TEXT:,}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"cannot parse {_clip(text)!r} ({e.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError(f"cannot parse {_clip(text)!r} (nested deeper than {MAX_DEPTH} levels)") from None
    stack = [(tree, 1)]
    while stack:                   # before anything recursive walks the tree
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"{_clip(text)!r} is nested deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    names: set = set()
    language.check(tree, names)
    return tree, names


def _clip(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


class Expr:
    """A checked expression; `evaluate(namespace)` looks names up in nested dicts.

    `where` (a rule key such as "condition") starts the message of every evaluation error."""

    def __init__(self, text: str, roots: set[str] | None = None, *, where: str = "", language: Language = RULES):
        self.text, self.where, self.language = text, where, language
        self.tree, self.names = parse(text, language)
        if roots is not None:
            unknown = sorted(n for n in self.names if n not in roots)
            if unknown:
                raise ExprError(f"unknown name {unknown[0]!r} in {_clip(text)!r}; known are {', '.join(sorted(roots))}")

    def evaluate(self, ns: dict):
        b = _BUDGET.get() or Budget(SECONDS, "one expression")
        try:
            return self.language.eval(self.tree, ns, b)
        except ExprError as e:
            raise self.error(str(e), e.kind) from None
        except Exception as e:  # NOTE: the last net: whatever the bounds missed is still one line
            raise self.error(f"{type(e).__name__}: {e}", type(e).__name__) from None

    def error(self, message: str, kind: str = "ExprError") -> ExprError:
        prefix = f"{self.where}: " if self.where else ""
        return ExprError(f"{prefix}{message} (in {_clip(self.text)!r})"[:400], kind)

    def __repr__(self):
        return f"Expr({self.text!r})"


_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?(?:\.(?P<precision>\d+))?[bcdeEfFgGnosxX%]?",
                   re.DOTALL)


def _check_spec(spec: str) -> str:
    m = _SPEC.fullmatch(spec)
    if not m:
        raise ExprError(f"{spec!r} is not a format spec (e.g. .2f, >8, .1%)")
    for part in ("width", "precision"):
        if m.group(part) and int(m.group(part)) > MAX_FORMAT:
            raise ExprError(f"format {spec!r}: {part} {m.group(part)} is past {MAX_FORMAT}")
    return spec


class Template:
    """A message: text with `{expression}` or `{expression:format}` fields, e.g.
    "{item.op} fell back on {item.calls} calls ({ms(item.seconds)}, {item.share:.0%})"."""

    def __init__(self, text: str, roots: set[str] | None = None, *, where: str = ""):
        if not isinstance(text, str):
            raise ExprError("expected a string")
        if len(text) > MAX_ITEMS:
            raise ExprError(f"a template of {len(text):,} characters; at most {MAX_ITEMS:,}")
        self.text, self.where = text, where
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
                field_ = text[i + 1:end]
                expr, spec = _split_spec(field_)
                if buf:
                    self.parts.append("".join(buf))
                    buf = []
                self.parts.append((Expr(expr, roots, where=where), _check_spec(spec)))
                i = end + 1
            elif ch == "}":
                raise ExprError(f"unmatched '}}' in {_clip(text)!r}")
            else:
                buf.append(ch)
                i += 1
        if buf:
            self.parts.append("".join(buf))

    @property
    def names(self) -> set:
        return {n for p in self.parts if isinstance(p, tuple) for n in p[0].names}

    def render(self, ns: dict) -> str:
        out, length = [], 0
        for p in self.parts:
            if isinstance(p, str):
                text = p
            else:
                expr, spec = p
                value = expr.evaluate(ns)
                try:
                    if isinstance(value, (list, tuple)) and not spec:
                        value = _join(value)
                    text = format(value, spec)
                except ExprError as e:
                    raise expr.error(str(e), e.kind) from None
                except Exception as e:
                    raise expr.error(f"cannot format it with {spec!r} ({type(e).__name__}: {e})") from None
            length += len(text)
            if length > MAX_ITEMS:
                raise ExprError(f"{self.where + ': ' if self.where else ''}the text is longer than "
                                f"{MAX_ITEMS:,} characters", "MemoryError")
            out.append(text)
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
    raise ExprError(f"unclosed '{{' in {_clip(text)!r}")


def _split_spec(field_):
    """'x.y:.2f' -> ('x.y', '.2f'): the last ':' outside brackets and quotes starts the spec."""
    cut = max((j for j, ch in _top_level(field_) if ch == ":"), default=-1)
    if cut < 0:
        return field_, ""
    return field_[:cut], field_[cut + 1:]
