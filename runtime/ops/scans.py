"""Scans and the reductions that answer more than one thing: cumprod, cummax/cummin, logcumsumexp, var_mean,
std_mean, aminmax, median, nanmedian and mode -- numpy reference kernels and their cost models."""
from __future__ import annotations

import numpy as np
import torch

from ..samples import F32_64, FLOAT, NC, NUM, SAMPLES, C, D, F, Sample
from .math import _axes, var
from .registry import define

aten = torch.ops.aten


def _read_all(n):
    return n.input_meta[0].numel


def _sorting(n):
    # a sort per reduced row: n log n compares over the input
    m = max(_read_all(n), 2)
    return int(m * np.log2(m))


def _dim(x, dim):
    return 0 if x.ndim == 0 else dim % x.ndim


@define("cumprod", "reduction", aten=("aten.cumprod", "aten.cumprod_"), flops=_read_all)
def cumprod(self, dim, dtype=None):
    return np.array(self) if self.ndim == 0 else np.cumprod(self, axis=dim)


@define("logcumsumexp", "reduction", aten=("aten.logcumsumexp",), flops=lambda n: 3 * _read_all(n), dtypes=F32_64)
def logcumsumexp(self, dim):
    if self.ndim == 0:
        return np.array(self)
    return np.logaddexp.accumulate(self.astype(np.float64), axis=dim)


def _cumulative_extreme(better):
    def kernel(self, dim):
        """Running extreme along dim and where it was reached; ATen takes the latest of equal values, and a NaN, once
        met, stays (with its own index)."""
        if self.ndim == 0:
            return np.array(self), np.zeros((), dtype=np.int64)
        x = np.moveaxis(self, _dim(self, dim), 0)
        values, indices = np.empty_like(x), np.empty(x.shape, dtype=np.int64)
        best, where = x[0].copy(), np.zeros(x.shape[1:], dtype=np.int64)
        values[0], indices[0] = best, where
        for i in range(1, x.shape[0]):
            take = better(x[i], best) | np.isnan(x[i]) if x.dtype.kind == "f" else better(x[i], best)
            if x.dtype.kind == "f":
                take &= ~np.isnan(best) | np.isnan(x[i])
            best = np.where(take, x[i], best)
            where = np.where(take, i, where)
            values[i], indices[i] = best, where
        return np.moveaxis(values, 0, _dim(self, dim)), np.moveaxis(indices, 0, _dim(self, dim))
    return kernel


define("cummax", "reduction", aten=("aten.cummax",), flops=_read_all)(_cumulative_extreme(np.greater_equal))
define("cummin", "reduction", aten=("aten.cummin",), flops=_read_all)(_cumulative_extreme(np.less_equal))


def _var_mean_args(self, dim, unbiased, keepdim, correction):
    if isinstance(dim, bool):              # var_mean.default(self, unbiased)
        dim, unbiased = None, dim
    return var(self, dim, unbiased, keepdim, correction=correction), \
        np.mean(self, axis=_axes(dim, self), keepdims=keepdim)


@define("var_mean", "reduction", aten=("aten.var_mean",), flops=lambda n: 3 * _read_all(n), dtypes=FLOAT)
def var_mean(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v, m = _var_mean_args(self, dim, unbiased, keepdim, correction)
    return [v, m]


@define("std_mean", "reduction", aten=("aten.std_mean",), flops=lambda n: 3 * _read_all(n), dtypes=FLOAT)
def std_mean(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    v, m = _var_mean_args(self, dim, unbiased, keepdim, correction)
    return [np.sqrt(v), m]


@define("aminmax", "reduction", aten=("aten.aminmax",), flops=lambda n: 2 * _read_all(n))
def aminmax(self, *, dim=None, keepdim=False):
    axis = None if dim is None or self.ndim == 0 else dim
    lo, hi = np.amin(self, axis=axis, keepdims=keepdim), np.amax(self, axis=axis, keepdims=keepdim)
    if dim is None and keepdim:            # ATen keeps every dim as 1 when reducing all of them
        lo, hi = lo.reshape((1,) * self.ndim), hi.reshape((1,) * self.ndim)
    return [lo, hi]


def _median(x, dim, keepdim, ignore_nan):
    """The lower median along dim and its index (ATen's: the median's position in the input); NaN propagates unless
    ignored, its index the first NaN's."""
    if x.ndim == 0:
        return np.array(x), np.zeros((), dtype=np.int64)
    d = _dim(x, dim)
    order = np.argsort(x, axis=d, kind="stable")          # NaNs sort last
    n = x.shape[d]
    if ignore_nan and x.dtype.kind == "f":
        valid = np.sum(~np.isnan(x), axis=d, keepdims=True)
        k = np.maximum((valid - 1) // 2, 0)
    else:
        k = np.full([1 if i == d else s for i, s in enumerate(x.shape)], (n - 1) // 2)
        if x.dtype.kind == "f":                  # any NaN: the answer is the first NaN
            nan = np.isnan(x).any(axis=d, keepdims=True)
            k = np.where(nan, np.sum(~np.isnan(x), axis=d, keepdims=True), k)
    index = np.take_along_axis(order, k.astype(np.int64), axis=d)
    values = np.take_along_axis(x, index, axis=d)
    if not keepdim:
        values, index = np.squeeze(values, d), np.squeeze(index, d)
    return values, index.astype(np.int64)


def _median_kernel(ignore_nan):
    def kernel(self, dim=None, keepdim=False):
        if dim is None:                    # median.default: a 0-d value of the flattened input
            return _median(self.reshape(-1), 0, False, ignore_nan)[0]
        return list(_median(self, dim, keepdim, ignore_nan))
    return kernel


define("median", "reduction", aten=("aten.median",), flops=_sorting)(_median_kernel(False))
define("nanmedian", "reduction", aten=("aten.nanmedian",), flops=_sorting)(_median_kernel(True))


@define("mode", "reduction", aten=("aten.mode",), flops=_sorting)
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest of equally frequent ones) and the last index it sits at."""
    if self.ndim == 0:
        return [np.array(self), np.zeros((), dtype=np.int64)]
    d = _dim(self, dim)
    x = np.moveaxis(self, d, -1)
    flat = x.reshape(-1, x.shape[-1]) if x.shape[-1] else x.reshape(-1, 0)
    values = np.empty(flat.shape[0], dtype=self.dtype)
    indices = np.zeros(flat.shape[0], dtype=np.int64)
    for r, row in enumerate(flat):
        uniq, counts = np.unique(row, return_counts=True)
        v = uniq[np.argmax(counts)]           # np.unique sorts: the first of the most frequent is the smallest
        values[r], indices[r] = v, np.flatnonzero(row == v)[-1]
    values, indices = values.reshape(x.shape[:-1]), indices.reshape(x.shape[:-1])
    if keepdim:
        values, indices = np.expand_dims(values, d), np.expand_dims(indices, d)
    return [values, indices]


SAMPLES.update({
    "cumprod": Sample(aten.cumprod.default, [(F(4, 5), 1), (F(2, 3, 4), -1), (NC(3, 4), 0), (F(0, 3), 1)], NUM),
    "logcumsumexp": Sample(aten.logcumsumexp.default, [(F(4, 5), 1), (F(2, 3, 4), -1), (NC(3, 4), 0)], F32_64),
    "cummax": Sample(aten.cummax.default, [(D(4, 5), 1), (D(2, 3, 4), -1), (NC(3, 4, distinct=True), 0)], NUM),
    "cummin": Sample(aten.cummin.default, [(D(4, 5), 1), (D(2, 3, 4), -1), (NC(3, 4, distinct=True), 0)], NUM),
    "var_mean": Sample(aten.var_mean.correction, [(F(4, 5), [1]), C(F(2, 3, 4), [0, 2], correction=0, keepdim=True),
                                                  (aten.var_mean.default, F(3, 4), False)], FLOAT),
    "std_mean": Sample(aten.std_mean.correction, [(F(4, 5), [1]), C(F(2, 3, 4), [0, 2], correction=0, keepdim=True),
                                                  (aten.std_mean.default, NC(3, 4), True)], FLOAT),
    "aminmax": Sample(aten.aminmax.default, [(F(4, 5),), C(F(2, 3, 4), dim=1), C(NC(3, 4), dim=0, keepdim=True)],
                      NUM),
    "median": Sample(aten.median.dim, [(D(4, 5), 1), (D(2, 3, 4), -1, True), (aten.median.default, D(3, 5))], NUM),
    "nanmedian": Sample(aten.nanmedian.dim, [(D(4, 5), 1), (D(2, 3, 4), -1, True), (aten.nanmedian.default, D(4, 5))],
                        NUM),
    "mode": Sample(aten.mode.default, [(D(4, 5), 1), (D(2, 3, 4), -1, True)], NUM),
})
