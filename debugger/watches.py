"""Watches: expressions over the current op's tensors, evaluated at every stop, with history.

    out.mean()           out: the op's output (the first one for multi-output ops: outs holds all)
    inputs[0].std()      inputs: the op's tensor inputs as numpy arrays
    np.abs(out).max()    np.NAME(...): a fixed set of numpy functions (NP below), not numpy itself
    out.abs().max()      tensor methods (METHODS), numpy's and torch's names: abs, norm, numel, ...
    out[0, :3].shape     indexing with ints, slices, None, ... and boolean masks; arithmetic

A watch is written in the advisor's expression language (profiler/advisor/expr.py) with tensor
methods, array attributes and those functions added. No module, class or function is a value,
and only the attributes in ATTRIBUTES can be read, so nothing reaches the interpreter (the old
`eval` exposed numpy, and `np.ctypeslib.ctypes.CDLL(None).system(...)` ran a shell). Functions
take fixed parameters -- no `out=` -- so a watch cannot write into the model's tensors, and
results are bounded like rule expressions (a broadcast past MAX_ELEMENTS is refused up front).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from opscope.profiler.advisor.expr import FUNCTIONS, MAX_ITEMS, Expr, ExprError, Language, budget
from opscope.runtime.errors import UsageError

from .stats import fmt

HISTORY = 32
SECONDS = 10.0                    # one watch at one stop (a reduction over a big tensor takes a while)
MAX_ELEMENTS = 1 << 27            # elements of an array a watch may make (by broadcasting)
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")


def _array(x):
    if not isinstance(x, (np.ndarray, np.generic)):
        raise ExprError(f"expected a tensor, got {type(x).__name__}", "TypeError")
    return x


def _broadcast(*values) -> None:
    """Refuse arrays that would broadcast past MAX_ELEMENTS (out[:, None] * out[None, :])."""
    shapes = [np.shape(v) for v in values if isinstance(v, (np.ndarray, np.generic, list, tuple))]
    if len(shapes) < 2:
        return
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return                     # numpy says why when the op runs
    if math.prod(shape) > MAX_ELEMENTS:
        raise ExprError(f"the result would have {math.prod(shape):,} elements; at most {MAX_ELEMENTS:,}",
                        "MemoryError")


def _iterated(f):
    """A builtin that walks its argument in Python (sum, list, ...): bounded, so it cannot stall."""
    def call(*args):
        if len(args) == 1 and hasattr(args[0], "__len__") and len(args[0]) > MAX_ITEMS:
            raise ExprError(f"{f.__name__}() over {len(args[0]):,} items; use the tensor method "
                            f"(x.sum(), x.max(), ...)", "MemoryError")
        return f(*args)
    return call


def _reduce(f):
    return lambda x, axis=None, keepdims=False: f(x, axis=axis, keepdims=bool(keepdims))


def _spread(f):
    return lambda x, axis=None, ddof=0, keepdims=False: f(x, axis=axis, ddof=ddof, keepdims=bool(keepdims))


def _unary(f):
    return lambda x: f(x)


def _binary(f):
    def call(a, b):
        _broadcast(a, b)
        return f(a, b)
    return call


def _where(cond, a, b):
    _broadcast(cond, a, b)
    return np.where(cond, a, b)


def _clip(x, lo=None, hi=None):
    _broadcast(x, lo, hi)
    return np.clip(x, lo, hi)


def _close(f):
    def call(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
        _broadcast(a, b)
        return f(a, b, rtol=float(rtol), atol=float(atol), equal_nan=bool(equal_nan))
    return call


def _norm(x, ord=None, axis=None, keepdims=False):
    return np.linalg.norm(x, ord=ord, axis=axis, keepdims=bool(keepdims))


def _round(x, decimals=0):
    return np.round(x, int(decimals))


REDUCTIONS = {name: _reduce(getattr(np, name)) for name in (
    "sum", "mean", "max", "min", "prod", "all", "any", "median", "nansum", "nanmean", "nanmax", "nanmin")}
REDUCTIONS |= {"argmax": lambda x, axis=None: np.argmax(x, axis=axis),
               "argmin": lambda x, axis=None: np.argmin(x, axis=axis),
               "count_nonzero": lambda x, axis=None: np.count_nonzero(x, axis=axis),
               "std": _spread(np.std), "var": _spread(np.var), "norm": _norm}
ELEMENTWISE = {name: _unary(getattr(np, name)) for name in (
    "abs", "sqrt", "exp", "log", "log2", "log10", "square", "sign", "floor", "ceil", "tanh", "sin", "cos",
    "isnan", "isinf", "isfinite")}

# np.NAME(...) in a watch: these, and nothing else of numpy
NP = {f"np.{name}": f for name, f in (REDUCTIONS | ELEMENTWISE).items()}
NP |= {"np.maximum": _binary(np.maximum), "np.minimum": _binary(np.minimum), "np.where": _where,
       "np.clip": _clip, "np.round": _round, "np.allclose": _close(np.allclose), "np.isclose": _close(np.isclose),
       "np.linalg.norm": _norm, "np.shape": np.shape, "np.size": np.size, "np.ndim": np.ndim,
       "np.amax": NP["np.max"], "np.amin": NP["np.min"]}
MATH = {f"math.{name}": _unary(getattr(math, name)) for name in (
    "sqrt", "exp", "log", "log2", "log10", "fabs", "isnan", "isinf", "isfinite", "tanh")}
BUILTINS = {"abs": abs, "len": len, "float": float, "int": int, "bool": bool, "str": str,
            "round": FUNCTIONS["round"],
            **{f.__name__: _iterated(f) for f in (min, max, sum, any, all, tuple, list)}}


def _tolist(x):
    if np.size(x) > MAX_ITEMS:
        raise ExprError(f"tolist() of {np.size(x):,} elements; at most {MAX_ITEMS:,}", "MemoryError")
    return x.tolist()


def _astype(x, dtype):
    if str(dtype) not in DTYPES:
        raise ExprError(f"astype({dtype!r}): expected one of {', '.join(DTYPES)}", "TypeError")
    return x.astype(str(dtype))


def _reshape(x, *shape):
    return x.reshape(*(int(s) for s in (shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)))


def _method(f):
    return lambda x, *a, **kw: f(_array(x), *a, **kw)


# x.NAME(...) on a tensor (numpy names, and torch's where people type them: abs, sqrt, numel, dim, float)
METHODS = {name: _method(f) for name, f in (REDUCTIONS | ELEMENTWISE).items()}
METHODS |= {name: _method(f) for name, f in {
    "round": _round, "clip": _clip, "item": lambda x: x.item(), "tolist": _tolist, "astype": _astype,
    "flatten": lambda x: x.flatten(), "ravel": lambda x: x.ravel(), "reshape": _reshape,
    "transpose": lambda x, *axes: x.transpose(*axes), "squeeze": lambda x, axis=None: x.squeeze(axis),
    "numel": lambda x: int(x.size), "dim": lambda x: int(x.ndim), "float": lambda x: x.astype(np.float32),
}.items()}
ATTRIBUTES = {"shape", "dtype", "size", "ndim", "T", "real", "imag", "nbytes", "itemsize"}
DTYPE_ATTRIBUTES = {"name", "itemsize", "kind"}


def _attribute(value, name):
    if (isinstance(value, (np.ndarray, np.generic)) and name in ATTRIBUTES) or \
            (isinstance(value, np.dtype) and name in DTYPE_ATTRIBUTES):
        return getattr(value, name)
    raise ExprError(f"no attribute {name!r} on {type(value).__name__}; tensors have {', '.join(sorted(ATTRIBUTES))}",
                    "AttributeError")


def _index(base, key):
    if isinstance(base, (np.ndarray, np.generic)):
        for k in key if isinstance(key, tuple) else (key,):
            mask = isinstance(k, np.ndarray) and k.dtype == np.bool_
            if not (mask or k is None or k is Ellipsis or isinstance(k, (int, np.integer, slice))):
                raise ExprError("index a tensor with ints, slices, None, ... or a boolean mask", "IndexError")
    return base[key]


WATCH = Language(functions=BUILTINS | NP | MATH, methods=METHODS, attribute=_attribute,
                 keywords=frozenset({"axis", "keepdims", "ddof", "ord", "decimals", "rtol", "atol", "equal_nan"}),
                 slices=True, operands=_broadcast, index=_index)
CONSTANTS = {"np": {"pi": np.pi, "e": np.e, "inf": np.inf, "nan": np.nan, "newaxis": None},
             "math": {"pi": math.pi, "e": math.e, "inf": math.inf, "nan": math.nan}}


def check(expr: str) -> Expr:
    """The watch as a checked expression; UsageError (one line) for anything outside the language."""
    try:
        return Expr(expr, language=WATCH)
    except ExprError as e:
        raise UsageError(f"watch {expr.strip()[:80]!r}: {e}") from None


def evaluate(expr: Expr, out, outs, inputs):
    ns = {"out": out, "outs": outs, "inputs": inputs, **CONSTANTS}
    with np.errstate(all="ignore"), budget(SECONDS, "one watch"):
        return expr.evaluate(ns)


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
    code: Expr = None
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
        w = Watch(expr.strip(), check(expr))
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
            except ExprError as e:     # a watch that fails on this op (no inputs[1]) is shown, not fatal
                w.history.append((label, f"{e.kind}: {e}"[:60], None))
            except Exception as e:     # NOTE: rendering a value the language let through: shown, not fatal
                w.history.append((label, f"{type(e).__name__}: {e}"[:60], None))
            del w.history[:-HISTORY]

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)
