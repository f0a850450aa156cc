"""Special functions and the elementwise math numpy lacks (exp2, hypot, erfinv, lgamma, digamma, Bessel
functions, orthogonal polynomials): numpy and scipy.special reference kernels.

Each kernel computes in float64 and the result is stored in the dtype capture recorded (float32 for an integer
input, as torch promotes); the few whose answer is defined by float32 arithmetic (nextafter, the polynomial
recurrences) run in the input's own dtype, step for step as ATen does.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special as sc
import torch

from ..samples import F32_64, FLOAT, NC, NUM, SAMPLES, F, I, Sample
from .registry import define

aten = torch.ops.aten
# float32/float64 (and integers, promoted): torch's CPU kernels of most special functions have no float16
REAL = frozenset({"float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"})
_TRANSCENDENTAL = 20        # FLOPs per element of a series or continued-fraction evaluation (a rough, fixed count)


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _per_element(k):
    return lambda n: k * n.output_meta[0].numel


def _unary(name, fn, aten_names=None, flops=_TRANSCENDENTAL, dtypes=REAL):
    define(name, "activation", aten=aten_names or (f"aten.{name}", f"aten.{name}_"), flops=_per_element(flops),
           dtypes=dtypes)(lambda self, _f=fn: _f(_f64(self)))


_unary("exp2", np.exp2, flops=4, dtypes=REAL | {"float16"})
_unary("erfc", sc.erfc)
_unary("erfinv", sc.erfinv)
_unary("lgamma", sc.gammaln)
_unary("i0", sc.i0, aten_names=("aten.i0", "aten.i0_", "aten.special_i0"))
_unary("i0e", sc.i0e, aten_names=("aten.special_i0e",))
_unary("i1", sc.i1, aten_names=("aten.special_i1",))
_unary("i1e", sc.i1e, aten_names=("aten.special_i1e",))
_unary("ndtri", sc.ndtri, aten_names=("aten.special_ndtri",))
_unary("log_ndtr", sc.log_ndtr, aten_names=("aten.special_log_ndtr",))
_unary("erfcx", sc.erfcx, aten_names=("aten.special_erfcx",))
_unary("bessel_j0", sc.j0, aten_names=("aten.special_bessel_j0",))
_unary("bessel_j1", sc.j1, aten_names=("aten.special_bessel_j1",))
_unary("bessel_y0", sc.y0, aten_names=("aten.special_bessel_y0",))
_unary("bessel_y1", sc.y1, aten_names=("aten.special_bessel_y1",))
_unary("modified_bessel_i0", sc.i0, aten_names=("aten.special_modified_bessel_i0",))
_unary("modified_bessel_i1", sc.i1, aten_names=("aten.special_modified_bessel_i1",))
_unary("modified_bessel_k0", sc.k0, aten_names=("aten.special_modified_bessel_k0",))
_unary("modified_bessel_k1", sc.k1, aten_names=("aten.special_modified_bessel_k1",))
_unary("scaled_modified_bessel_k0", sc.k0e, aten_names=("aten.special_scaled_modified_bessel_k0",))
_unary("scaled_modified_bessel_k1", sc.k1e, aten_names=("aten.special_scaled_modified_bessel_k1",))
_unary("airy_ai", lambda x: sc.airy(x)[0], aten_names=("aten.special_airy_ai",))
_unary("spherical_bessel_j0", lambda x: sc.spherical_jn(0, x), aten_names=("aten.special_spherical_bessel_j0",))


@define("digamma", "activation", aten=("aten.digamma", "aten.digamma_", "aten.special_digamma", "aten.special_psi"),
        flops=_per_element(_TRANSCENDENTAL), dtypes=REAL)
def digamma(self):
    """psi(x); ATen gives -inf at 0 (scipy: nan for -0.0) and nan at the negative integers."""
    x = _f64(self)
    out = sc.psi(x)
    return np.where(x == 0, -np.inf, out)


@define("signbit", "elementwise", aten=("aten.signbit",))
def signbit(self):
    return np.signbit(self)


def _binary(name, fn, kind="elementwise", flops=1, aten_names=None, dtypes=REAL | {"float16"}, same_dtype=False):
    def kernel(self, other, _f=fn):
        if same_dtype:       # defined by the stored dtype's own arithmetic: no float64 detour
            dt = np.result_type(self, other)
            return _f(np.asarray(self, dtype=dt), np.asarray(other, dtype=dt))
        return _f(_f64(self), _f64(other))
    define(name, kind, aten=aten_names or (f"aten.{name}", f"aten.{name}_"), flops=_per_element(flops),
           dtypes=dtypes)(kernel)


_binary("hypot", np.hypot, flops=4)
_binary("copysign", np.copysign)
_binary("fmax", np.fmax)
_binary("fmin", np.fmin)
_binary("nextafter", np.nextafter, same_dtype=True)
_binary("logaddexp2", np.logaddexp2, kind="activation", flops=8)
_binary("igamma", sc.gammainc, kind="activation", flops=_TRANSCENDENTAL, aten_names=("aten.igamma", "aten.igamma_",
                                                                                     "aten.special_gammainc"))
_binary("igammac", sc.gammaincc, kind="activation", flops=_TRANSCENDENTAL,
        aten_names=("aten.igammac", "aten.igammac_", "aten.special_gammaincc"))
_binary("zeta", sc.zeta, kind="activation", flops=_TRANSCENDENTAL, aten_names=("aten.special_zeta",))


@define("polygamma", "activation", aten=("aten.polygamma", "aten.special_polygamma"),
        flops=_per_element(_TRANSCENDENTAL), dtypes=REAL)
def polygamma(n, self):
    """The n-th derivative of digamma (n = 0: digamma itself, with ATen's value at 0; n = 1: ATen's own trigamma)."""
    if int(n) == 0:
        return digamma(self)
    if int(n) == 1:
        return _trigamma(np.asarray(self) if np.asarray(self).dtype.kind == "f" else _f64(self))
    return sc.polygamma(int(n), _f64(self))


def _trigamma(x):
    """ATen's calc_trigamma, in x's dtype: below 0.5 its reflection through sin(pi x) -- in float32 that loses digits
    near the poles, and a float32 answer must lose the same ones to be eager's."""
    t = x.dtype.type
    with np.errstate(all="ignore"):
        reflect = x < t(0.5)
        s = np.sin(t(math.pi) * x)
        result = np.where(reflect, -(t(math.pi) * t(math.pi)) / (s * s), t(0)).astype(x.dtype)
        x = np.where(reflect, t(1) - x, x).astype(x.dtype)
        for _ in range(6):
            result = result + t(1) / (x * x)
            x = x + t(1)
        ixx = t(1) / (x * x)
        result = result + (t(1) + t(1) / (t(2) * x) + ixx * (t(1 / 6) - ixx * (t(1 / 30) - ixx * t(1 / 42)))) / x
    return np.where(reflect, -result, result)


@define("mvlgamma", "activation", aten=("aten.mvlgamma", "aten.mvlgamma_", "aten.special_multigammaln"),
        flops=lambda n: _TRANSCENDENTAL * n.output_meta[0].numel * int(n.attrs.get("p", 1)), dtypes=REAL)
def mvlgamma(self, p):
    """Multivariate log-gamma of dimension p: p(p-1)/4 log(pi) + sum_j lgamma(x - j/2), j < p."""
    x = _f64(self)
    return p * (p - 1) / 4 * math.log(math.pi) + sum(sc.gammaln(x - j / 2) for j in range(p))


# --- orthogonal polynomials: ATen's own recurrences (runtime n per element, truncated to an integer) ------------
def _recurrence(x, n, p1, step, direct=None):
    """Evaluate p_n(x) for every element: p_0 = 1, p_1 given, p_{k+1} = step(k, p_k, p_{k-1}); `direct(x, n)` -> (mask,
    values) where ATen answers in closed form instead. In x's dtype, as ATen's float kernels compute."""
    n = np.broadcast_to(np.trunc(np.asarray(n, dtype=np.float64)), np.broadcast(x, n).shape)
    x = np.broadcast_to(x, n.shape)
    ni = n.astype(np.int64)
    out = np.where(ni == 0, np.ones_like(x), p1(x))
    top = int(ni.max(initial=0))
    prev, cur = np.ones_like(x), p1(x)
    with np.errstate(all="ignore"):
        for k in range(1, top):
            prev, cur = cur, step(k, x, cur, prev)
            out = np.where(ni == k + 1, cur, out)
        if direct is not None:
            mask, values = direct(x, ni)
            out = np.where(mask, values, out)
    return np.where(ni < 0, np.zeros_like(x), out)


def _float(x):
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def _cheb(kind):
    one = {"t": lambda x: x, "u": lambda x: x + x, "v": lambda x: x + x - 1, "w": lambda x: x + x + 1}[kind]

    def direct(x, n):
        a = np.abs(x)
        acos = np.arccos(np.clip(x, -1, 1))
        even = n % 2 == 0
        if kind == "t":
            edge = np.where((x > 0) | even, 1, -1).astype(x.dtype)
            trig = np.cos(n * acos).astype(x.dtype)
            limit = 6
        elif kind == "u":
            edge = np.where((x > 0) | even, n + 1, -(n + 1)).astype(x.dtype)
            s = np.sin(acos)
            trig = np.where(s != 0, np.sin((n + 1) * acos) / np.where(s != 0, s, 1),
                            (n + 1) * np.cos((n + 1) * acos) / x).astype(x.dtype)
            limit = 8
        elif kind == "v":
            edge = np.where(x > 0, 1, np.where(even, n + n + 1, -(n + n + 1))).astype(x.dtype)
            c = np.cos(acos / 2)
            trig = np.where(np.sin(acos / 2) != 1, np.cos((n + 0.5) * acos) / np.where(c != 0, c, 1), edge)
            trig = trig.astype(x.dtype)
            limit = 8
        else:
            edge = np.where(x > 0, n + n + 1, np.where(even, 1, -1)).astype(x.dtype)
            s = np.sin(acos / 2)
            trig = np.where(np.cos(acos / 2) != 1, np.sin((n + 0.5) * acos) / np.where(s != 0, s, 1), edge)
            trig = trig.astype(x.dtype)
            limit = 8
        at_one = a == 1
        use_trig = (n > limit) & (a < 1)
        return at_one | use_trig, np.where(at_one, edge, trig)

    def fn(x, n):
        x = _float(x)
        return _recurrence(x, n, one, lambda k, x, p, q: (x + x) * p - q, direct)
    return fn


def _shifted(fn):
    return lambda x, n: fn(_float(x) + _float(x) - 1, n)


def _hermite_h(x, n):
    x = _float(x)
    return _recurrence(x, n, lambda x: x + x, lambda k, x, p, q: (x + x) * p - (k + k) * q)


def _hermite_he(x, n):
    x = _float(x)
    return _recurrence(x, n, lambda x: x, lambda k, x, p, q: x * p - k * q)


def _laguerre(x, n):
    x = _float(x)
    out = _recurrence(x, n, lambda x: 1 - x, lambda k, x, p, q: ((k + k + 1 - x) * p - k * q) / (k + 1))
    n = np.broadcast_to(np.trunc(np.asarray(n, dtype=np.float64)), out.shape)
    return np.where((np.broadcast_to(x, out.shape) == 0) & (n >= 0), np.ones_like(out), out)


def _legendre(x, n):
    x = _float(x)
    out = _recurrence(x, n, lambda x: x, lambda k, x, p, q: ((k + k + 1) * x * p - k * q) / (k + 1))
    n = np.broadcast_to(np.trunc(np.asarray(n, dtype=np.float64)), out.shape).astype(np.int64)
    xb = np.broadcast_to(x, out.shape)
    edge = np.where((xb > 0) | (n % 2 == 0), 1, -1).astype(out.dtype)
    return np.where((np.abs(xb) == 1) & (n >= 0), edge, out)


_POLYNOMIALS = {"chebyshev_polynomial_t": _cheb("t"), "chebyshev_polynomial_u": _cheb("u"),
                "chebyshev_polynomial_v": _cheb("v"), "chebyshev_polynomial_w": _cheb("w"),
                "shifted_chebyshev_polynomial_t": _shifted(_cheb("t")),
                "shifted_chebyshev_polynomial_u": _shifted(_cheb("u")),
                "shifted_chebyshev_polynomial_v": _shifted(_cheb("v")),
                "shifted_chebyshev_polynomial_w": _shifted(_cheb("w")),
                "hermite_polynomial_h": _hermite_h, "hermite_polynomial_he": _hermite_he,
                "laguerre_polynomial_l": _laguerre, "legendre_polynomial_p": _legendre}


def _polynomial_flops(node):
    # a recurrence of n steps, a few FLOPs each; n is data, so the cost counts a typical degree of 8
    return 3 * 8 * node.output_meta[0].numel


for _name, _fn in _POLYNOMIALS.items():
    define(_name, "activation", aten=(f"aten.special_{_name}",), flops=_polynomial_flops,
           dtypes=frozenset({"float32", "float64"}))(lambda x, n, _f=_fn: _f(x, n))


_POS = dict(lo=0.1, hi=3.0)
SAMPLES.update({
    "exp2": Sample(aten.exp2.default, [(F(4, 5),), (F(2, 0, 3),), (NC(3, 6),)], NUM),
    "signbit": Sample(aten.signbit.default, [(F(4, 5),), (NC(3, 6),), (I(3, 4, hi=5),)], NUM),
    "digamma": Sample(aten.digamma.default, [(F(4, 5, lo=0.2, hi=5),), (NC(3, 6, lo=-2.5, hi=-1.5),)], F32_64),
    "polygamma": Sample(aten.polygamma.default, [(1, F(4, 5, lo=0.5, hi=4)), (2, NC(3, 4, lo=0.5, hi=4)),
                                                 (0, F(3, lo=0.5, hi=4))], F32_64),
    "mvlgamma": Sample(aten.mvlgamma.default, [(F(4, 5, lo=2.5, hi=5), 1), (F(3, 4, lo=2.5, hi=5), 3)], F32_64),
    "hypot": Sample(aten.hypot.default, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (NC(3, 4), F(1, 4))], FLOAT),
    "copysign": Sample(aten.copysign.Tensor, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (NC(3, 4), F(1, 4))], FLOAT),
    "fmax": Sample(aten.fmax.default, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (NC(3, 4), F(1, 4))], NUM),
    "fmin": Sample(aten.fmin.default, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3)), (NC(3, 4), F(1, 4))], NUM),
    "nextafter": Sample(aten.nextafter.default, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3))], F32_64),
    "logaddexp2": Sample(aten.logaddexp2.default, [(F(4, 5), F(4, 5)), (F(2, 1, 3), F(4, 3))], F32_64),
    "igamma": Sample(aten.igamma.default, [(F(4, 5, **_POS), F(4, 5, **_POS)), (F(2, 1, 3, **_POS), F(4, 3, **_POS))],
                     F32_64),
    "igammac": Sample(aten.igammac.default, [(F(4, 5, **_POS), F(4, 5, **_POS)), (NC(3, 4, **_POS), F(1, 4, **_POS))],
                      F32_64),
    "zeta": Sample(aten.special_zeta.default, [(F(4, 5, lo=1.5, hi=4), F(4, 5, **_POS)),
                                              (F(2, 1, 3, lo=1.5, hi=4), F(4, 3, **_POS))], F32_64),
})
for _name, _lo, _hi in [("erfc", -2, 2), ("erfinv", -0.9, 0.9), ("lgamma", 0.1, 5), ("i0", -2, 2),
                        ("i0e", -2, 2), ("i1", -2, 2), ("i1e", -2, 2), ("ndtri", 0.05, 0.95), ("log_ndtr", -3, 3),
                        ("erfcx", -2, 2), ("bessel_j0", -5, 5), ("bessel_j1", -5, 5), ("bessel_y0", 0.2, 5),
                        ("bessel_y1", 0.2, 5), ("modified_bessel_i0", -2, 2), ("modified_bessel_i1", -2, 2),
                        ("modified_bessel_k0", 0.2, 3), ("modified_bessel_k1", 0.2, 3),
                        ("scaled_modified_bessel_k0", 0.2, 3), ("scaled_modified_bessel_k1", 0.2, 3),
                        ("airy_ai", -3, 3), ("spherical_bessel_j0", -5, 5)]:
    _packet = getattr(aten, _name if _name in ("erfc", "erfinv", "lgamma", "i0") else f"special_{_name}")
    # torch's float64 airy_ai is itself off by 3e-5 (relative): its float32 answers are what can be checked
    SAMPLES[_name] = Sample(_packet.default, [(F(4, 5, lo=_lo, hi=_hi),), (F(2, 0, 3, lo=_lo, hi=_hi),),
                                              (NC(3, 6, lo=_lo, hi=_hi),)],
                            ("float32",) if _name == "airy_ai" else F32_64)
for _name in _POLYNOMIALS:
    _lo = 0.0 if _name.startswith("shifted") else -1.0
    _packet = getattr(aten, f"special_{_name}")
    SAMPLES[_name] = Sample(_packet.default, [(F(4, 5, lo=_lo, hi=1.0), I(4, 5, hi=6)),
                                              (NC(3, 4, lo=_lo, hi=1.0), I(3, 4, hi=12)),
                                              (_packet.x_scalar, 0.5, I(3, hi=5)),
                                              (_packet.n_scalar, F(6, lo=_lo, hi=1.0), 3)], ("float32", "float64"))
