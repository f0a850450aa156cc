"""Elementwise, activation, comparison and reduction ops: numpy reference kernels."""
from __future__ import annotations

import math

import numpy as np

from .registry import alias, define

_SQRT2 = math.sqrt(2.0)


def _erf(x):
    # numpy has no erf. float64 inputs get libm's erf through torch (math.erf per element took
    # seconds on a GPT-2 MLP activation); narrower dtypes get Abramowitz-Stegun 7.1.26 in float64,
    # whose 1.5e-7 error is below their ulp.
    x = np.asarray(x)
    if x.dtype == np.float64:
        import torch
        return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - poly * np.exp(-z * z)
    return (np.sign(x) * y).astype(x.dtype)


# --- binary arithmetic -------------------------------------------------------------------
@define("add", "elementwise", aten=("aten.add", "aten.add_"))
def add(self, other, alpha=1):
    return self + (other * alpha if alpha != 1 else other)


@define("sub", "elementwise", aten=("aten.sub", "aten.sub_"))
def sub(self, other, alpha=1):
    return self - (other * alpha if alpha != 1 else other)


@define("rsub", "elementwise", aten=("aten.rsub",))
def rsub(self, other, alpha=1):
    return other - self * alpha


@define("mul", "elementwise", aten=("aten.mul", "aten.mul_"))
def mul(self, other):
    return self * other


@define("div", "elementwise", aten=("aten.div", "aten.div_"))
def div(self, other, rounding_mode=None):
    out = np.true_divide(self, other)
    if rounding_mode == "floor":
        out = np.floor(out)
    elif rounding_mode == "trunc":
        out = np.trunc(out)
    return out


@define("floor_divide", "elementwise", aten=("aten.floor_divide",))
def floor_divide(self, other):
    return np.floor_divide(self, other)


@define("remainder", "elementwise", aten=("aten.remainder",))
def remainder(self, other):
    return np.remainder(self, other)


@define("pow", "elementwise", aten=("aten.pow",))
def pow_(self, exponent):
    return np.power(self, exponent)


@define("maximum", "elementwise", aten=("aten.maximum",))
def maximum(self, other):
    return np.maximum(self, other)


@define("minimum", "elementwise", aten=("aten.minimum",))
def minimum(self, other):
    return np.minimum(self, other)


# --- unary math --------------------------------------------------------------------------
def _unary(name, fn, kind="elementwise", aten=None):
    define(name, kind, aten=aten or (f"aten.{name}", f"aten.{name}_"))(fn)


_unary("neg", lambda self: np.negative(self))
_unary("abs", lambda self: np.abs(self))
_unary("exp", lambda self: np.exp(self))
_unary("log", lambda self: np.log(self))
_unary("sqrt", lambda self: np.sqrt(self))
_unary("rsqrt", lambda self: 1.0 / np.sqrt(self))
_unary("sin", lambda self: np.sin(self))
_unary("cos", lambda self: np.cos(self))
_unary("reciprocal", lambda self: np.reciprocal(self))
_unary("erf", lambda self: _erf(self))
_unary("floor", lambda self: np.floor(self))
_unary("ceil", lambda self: np.ceil(self))
_unary("round", lambda self, decimals=0: np.round(self, decimals))
_unary("sign", lambda self: np.sign(self))
_unary("logical_not", lambda self: np.logical_not(self))
_unary("bitwise_not", lambda self: np.invert(self))
_unary("isnan", lambda self: np.isnan(self))
_unary("isinf", lambda self: np.isinf(self))
_unary("trunc", lambda self: np.trunc(self), aten=("aten.trunc", "aten.trunc_", "aten.fix"))
for _name, _fn in {"tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
                   "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
                   "expm1": np.expm1, "log1p": np.log1p, "log2": np.log2, "log10": np.log10}.items():
    # transcendental: a few FLOPs each, counted like activations
    _unary(_name, lambda self, _f=_fn: _f(self), kind="activation")
alias("asin", "aten.arcsin", "aten.arcsin_")
alias("acos", "aten.arccos", "aten.arccos_")
alias("atan", "aten.arctan", "aten.arctan_")
alias("asinh", "aten.arcsinh")
alias("acosh", "aten.arccosh")
alias("atanh", "aten.arctanh")


@define("atan2", "activation", aten=("aten.atan2", "aten.atan2_", "aten.arctan2"))
def atan2(self, other):
    return np.arctan2(self, other)


@define("fmod", "elementwise", aten=("aten.fmod", "aten.fmod_"))
def fmod(self, other):
    """C-style remainder: the sign of the dividend (remainder takes the divisor's)."""
    return np.fmod(self, other)


@define("clamp", "elementwise", aten=("aten.clamp", "aten.clamp_", "aten.clip"))
def clamp(self, min=None, max=None):
    if self.dtype.kind in "iub" and any(isinstance(v, float) for v in (min, max)):
        self = self.astype(np.float32)    # torch promotes an int tensor clamped by a float
    out = self
    if min is not None:
        out = np.maximum(out, np.asarray(min, dtype=self.dtype) if np.isscalar(min) else min)
    if max is not None:
        out = np.minimum(out, np.asarray(max, dtype=self.dtype) if np.isscalar(max) else max)
    return out


@define("clamp_min", "elementwise", aten=("aten.clamp_min",))
def clamp_min(self, min):
    return clamp(self, min=min)


@define("clamp_max", "elementwise", aten=("aten.clamp_max",))
def clamp_max(self, max):
    return clamp(self, max=max)


# --- activations -------------------------------------------------------------------------
@define("relu", "activation", aten=("aten.relu", "aten.relu_"), flops=lambda n: n.output_meta[0].numel)
def relu(self):
    return np.maximum(self, np.zeros((), dtype=self.dtype))


@define("gelu", "activation", aten=("aten.gelu", "aten.gelu_"), flops=lambda n: 8 * n.output_meta[0].numel)
def gelu(self, approximate="none"):
    x = self.astype(np.float64)
    if approximate == "tanh":
        # in place, one temporary: x ** 3 and the chained expression cost 4x more on big activations
        c = math.sqrt(2.0 / math.pi)
        y = x * x
        y *= 0.044715 * c
        y += c
        y *= x
        np.tanh(y, out=y)
        y += 1.0
        y *= x
        y *= 0.5
    else:
        y = 0.5 * x * (1.0 + _erf(self / _SQRT2).astype(np.float64))
    return y.astype(self.dtype)


@define("silu", "activation", aten=("aten.silu", "aten.silu_"))
def silu(self):
    return self / (1.0 + np.exp(-self))


@define("sigmoid", "activation", aten=("aten.sigmoid", "aten.sigmoid_"))
def sigmoid(self):
    return 1.0 / (1.0 + np.exp(-self))


@define("tanh", "activation", aten=("aten.tanh", "aten.tanh_"))
def tanh(self):
    return np.tanh(self)


@define("hardtanh", "activation", aten=("aten.hardtanh", "aten.hardtanh_"))
def hardtanh(self, min_val=-1.0, max_val=1.0):
    return np.clip(self, min_val, max_val).astype(self.dtype)


@define("hardswish", "activation", aten=("aten.hardswish", "aten.hardswish_"))
def hardswish(self):
    return (self * np.clip(self + 3.0, 0.0, 6.0) / 6.0).astype(self.dtype)


@define("hardsigmoid", "activation", aten=("aten.hardsigmoid", "aten.hardsigmoid_"))
def hardsigmoid(self):
    return (np.clip(self + 3.0, 0.0, 6.0) / 6.0).astype(self.dtype)


@define("leaky_relu", "activation", aten=("aten.leaky_relu", "aten.leaky_relu_"))
def leaky_relu(self, negative_slope=0.01):
    return np.where(self > 0, self, self * negative_slope).astype(self.dtype)


@define("elu", "activation", aten=("aten.elu", "aten.elu_"))
def elu(self, alpha=1.0, scale=1.0, input_scale=1.0):
    return (scale * np.where(self > 0, self, alpha * (np.exp(self * input_scale) - 1))).astype(self.dtype)


@define("softplus", "activation", aten=("aten.softplus",))
def softplus(self, beta=1.0, threshold=20.0):
    bx = self * beta
    return np.where(bx > threshold, self, np.logaddexp(0, bx) / beta).astype(self.dtype)


# --- comparison and selection ------------------------------------------------------------
for _name, _fn in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                   "gt": np.greater, "ge": np.greater_equal, "logical_and": np.logical_and,
                   "logical_or": np.logical_or, "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and,
                   "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}.items():
    define(_name, "elementwise", aten=(f"aten.{_name}",))(lambda self, other, _f=_fn: _f(self, other))


@define("where", "elementwise", aten=("aten.where",))
def where(condition, self=None, other=None):
    if self is None:
        return tuple(np.nonzero(condition))
    return np.where(condition, self, other)


@define("masked_fill", "elementwise", aten=("aten.masked_fill", "aten.masked_fill_"))
def masked_fill(self, mask, value):
    return np.where(mask, np.asarray(value, dtype=self.dtype), self)


# --- reductions --------------------------------------------------------------------------
def _axes(dim, x=None):
    # NOTE: torch lets a 0-d tensor reduce over dim 0 or -1 (and returns it); numpy raises AxisError.
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) or (x is not None and np.ndim(x) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


@define("sum", "reduction", aten=("aten.sum",), flops=lambda n: n.input_meta[0].numel)
def sum_(self, dim=None, keepdim=False, dtype=None):
    return np.sum(self, axis=_axes(dim, self), keepdims=keepdim)


@define("mean", "reduction", aten=("aten.mean",), flops=lambda n: n.input_meta[0].numel)
def mean(self, dim=None, keepdim=False, dtype=None):
    return np.mean(self, axis=_axes(dim, self), keepdims=keepdim)


@define("prod", "reduction", aten=("aten.prod",), flops=lambda n: n.input_meta[0].numel)
def prod(self, dim=None, keepdim=False, dtype=None):
    return np.prod(self, axis=_axes(dim, self), keepdims=keepdim)


@define("amax", "reduction", aten=("aten.amax",), flops=lambda n: n.input_meta[0].numel)
def amax(self, dim=(), keepdim=False):
    return np.amax(self, axis=_axes(dim, self), keepdims=keepdim)


@define("amin", "reduction", aten=("aten.amin",), flops=lambda n: n.input_meta[0].numel)
def amin(self, dim=(), keepdim=False):
    return np.amin(self, axis=_axes(dim, self), keepdims=keepdim)


@define("max", "reduction", aten=("aten.max",), flops=lambda n: n.input_meta[0].numel)
def max_(self, dim=None, keepdim=False):
    if dim is None:
        return np.max(self)
    if not np.isscalar(dim) and not isinstance(dim, int):  # max.other: elementwise
        return np.maximum(self, dim)
    return np.max(self, axis=dim, keepdims=keepdim), np.argmax(self, axis=dim, keepdims=keepdim)


@define("min", "reduction", aten=("aten.min",), flops=lambda n: n.input_meta[0].numel)
def min_(self, dim=None, keepdim=False):
    if dim is None:
        return np.min(self)
    if not np.isscalar(dim) and not isinstance(dim, int):
        return np.minimum(self, dim)
    return np.min(self, axis=dim, keepdims=keepdim), np.argmin(self, axis=dim, keepdims=keepdim)


@define("argmax", "reduction", aten=("aten.argmax",), flops=lambda n: n.input_meta[0].numel)
def argmax(self, dim=None, keepdim=False):
    if dim is None:
        return np.asarray(np.argmax(self))
    return np.argmax(self, axis=dim, keepdims=keepdim)


@define("argmin", "reduction", aten=("aten.argmin",), flops=lambda n: n.input_meta[0].numel)
def argmin(self, dim=None, keepdim=False):
    if dim is None:
        return np.asarray(np.argmin(self))
    return np.argmin(self, axis=dim, keepdims=keepdim)


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


@define("var", "reduction", aten=("aten.var",), flops=lambda n: 3 * n.input_meta[0].numel)
def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):              # var.default(self, unbiased)
        dim, unbiased = None, dim
    if isinstance(unbiased, bool) or unbiased is None:
        ddof = _correction(correction, unbiased)
    else:  # var.correction(self, dim, *, correction, keepdim)
        ddof = _correction(correction, True)
    return np.var(self, axis=_axes(dim, self), ddof=ddof, keepdims=keepdim)


@define("std", "reduction", aten=("aten.std",), flops=lambda n: 3 * n.input_meta[0].numel)
def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return np.sqrt(var(self, dim, unbiased, keepdim, correction=correction))


@define("all", "reduction", aten=("aten.all",))
def all_(self, dim=None, keepdim=False):
    return np.all(self, axis=_axes(dim, self), keepdims=keepdim)


@define("any", "reduction", aten=("aten.any",))
def any_(self, dim=None, keepdim=False):
    return np.any(self, axis=_axes(dim, self), keepdims=keepdim)


@define("vector_norm", "reduction", aten=("aten.linalg_vector_norm",), flops=lambda n: 2 * n.input_meta[0].numel)
def vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    # NOTE: not np.linalg.norm -- over two axes it computes a matrix norm (ord=2: the spectral norm).
    axis = _axes(dim, self)
    a = np.abs(self)
    if ord == math.inf:
        return np.amax(a, axis=axis, keepdims=keepdim)
    if ord == -math.inf:
        return np.amin(a, axis=axis, keepdims=keepdim)
    if ord == 0:
        return np.sum(a != 0, axis=axis, keepdims=keepdim).astype(self.dtype)
    if ord == 1:
        return np.sum(a, axis=axis, keepdims=keepdim)
    if ord == 2:
        return np.sqrt(np.sum(a * a, axis=axis, keepdims=keepdim))
    return np.sum(a ** ord, axis=axis, keepdims=keepdim) ** (1.0 / ord)


@define("histc", "reduction", aten=("aten.histc",), flops=lambda n: n.input_meta[0].numel)
def histc(self, bins=100, min=0, max=0):
    """Counts in `bins` equal bins over [min, max] (the data's range when min == max); others ignored."""
    lo, hi = float(min), float(max)
    if lo == hi and self.size:
        lo, hi = float(np.min(self)), float(np.max(self))
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts, _ = np.histogram(self.astype(np.float64), bins=bins, range=(lo, hi))
    return counts.astype(self.dtype)


@define("cumsum", "reduction", aten=("aten.cumsum",), flops=lambda n: n.input_meta[0].numel)
def cumsum(self, dim, dtype=None):
    return np.array(self) if self.ndim == 0 else np.cumsum(self, axis=dim)


# bool tensors use & and | (aten.__and__ / __or__) for masks
define("and", "elementwise", aten=("aten.__and__", "aten.__iand__"))(lambda self, other: np.bitwise_and(self, other))
define("or", "elementwise", aten=("aten.__or__", "aten.__ior__"))(lambda self, other: np.bitwise_or(self, other))
