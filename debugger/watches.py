"""Watches: expressions over the current op's tensors, evaluated at every stop, with history.

    out.mean()          out: the op's output (the first one for multi-output ops: outs holds all)
    inputs[0].std()     inputs: the op's tensor inputs as numpy arrays
    np.abs(out).max()   np: numpy

Evaluation is restricted: no builtins beyond a few pure ones, and no names or attributes that
start with an underscore (the usual way out of an eval sandbox is `().__class__...`).
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

import numpy as np

from opscope.runtime.errors import UsageError

from .stats import fmt

HISTORY = 32
_SAFE_BUILTINS = {"abs": abs, "min": min, "max": max, "len": len, "float": float, "int": int, "round": round,
                  "sum": sum, "any": any, "all": all, "bool": bool, "tuple": tuple, "list": list,
                  # NOTE: numpy imports lazily from C (a.std() on first use) through the *calling*
                  # frame's builtins. Expressions cannot name it: check() refuses names with _.
                  "__import__": __import__}


def check(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise UsageError(f"watch {expr!r}: not a Python expression ({e.msg})")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr.startswith("_"):
            raise UsageError(f"watch {expr!r}: attributes starting with _ are not allowed")
        if isinstance(n, ast.Name) and n.id.startswith("_"):
            raise UsageError(f"watch {expr!r}: names starting with _ are not allowed")
        if isinstance(n, (ast.Lambda, ast.NamedExpr)):
            raise UsageError(f"watch {expr!r}: lambdas and := are not allowed")
    return tree


def evaluate(code, out, outs, inputs):
    ns = {"out": out, "outs": outs, "inputs": inputs, "np": np, "math": math}
    return eval(code, {"__builtins__": _SAFE_BUILTINS}, ns)


def render(value) -> str:
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return render(value.reshape(()).item())
        return f"array{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (float, np.floating)):
        return fmt(float(value))
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    s = str(value)
    return s if len(s) < 40 else s[:37] + "..."


@dataclass
class Watch:
    expr: str
    code: object = None
    history: list = field(default_factory=list)     # [(label, text, number|None)]

    @property
    def last(self) -> str:
        return self.history[-1][1] if self.history else ""

    def numbers(self) -> list[float]:
        return [v for _, _, v in self.history if v is not None and math.isfinite(v)]


class Watches:
    def __init__(self):
        self.items: list[Watch] = []

    def add(self, expr: str) -> Watch:
        tree = check(expr)
        w = Watch(expr.strip(), compile(tree, "<watch>", "eval"))
        self.items.append(w)
        return w

    def remove(self, index: int) -> None:
        del self.items[index]

    def update(self, label: str, out, outs, inputs) -> None:
        for w in self.items:
            try:
                v = evaluate(w.code, out, outs, inputs)
                num = float(v) if isinstance(v, (int, float, np.number)) or (isinstance(v, np.ndarray) and v.size == 1) else None
                w.history.append((label, render(v), num))
            except Exception as e:     # a watch that fails on this op (no inputs[1]) is shown, not fatal
                w.history.append((label, f"{type(e).__name__}: {e}"[:60], None))
            del w.history[:-HISTORY]

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)
