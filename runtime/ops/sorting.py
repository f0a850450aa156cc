"""Sorting and selection: sort, argsort, topk, kthvalue, msort -- numpy kernels.

Sorts are stable, as ATen's CPU sort is; NaN sorts above every number (torch's order), which a
descending sort puts first.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import define


def _sort_flops(n):
    m = n.input_meta[0]
    size = m.shape[-1] if m.shape else 1
    return int(m.numel * max(1.0, math.log2(max(size, 2))))


def _order(x, dim, descending):
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    if not descending:
        return np.argsort(x, axis=dim, kind="stable")
    if x.dtype == np.bool_:
        x = x.astype(np.int8)
    # stable descending: sort the reversed array ascending, then reverse (ties keep their order)
    rev = np.flip(x, axis=dim)
    idx = np.flip(np.argsort(rev, axis=dim, kind="stable"), axis=dim)
    return (x.shape[dim] - 1 - idx) if x.shape[dim] else idx


@define("sort", "reduction", aten=("aten.sort",), flops=_sort_flops)
def sort(self, *args, stable=None, dim=-1, descending=False):
    """(values, indices); sort.default(self, dim, descending) and sort.stable(self, *, stable, dim, descending)."""
    if args:
        dim = args[0]
        descending = args[1] if len(args) > 1 else descending
    idx = _order(self, dim, descending)
    return (np.array(self), idx) if self.ndim == 0 else (np.take_along_axis(self, idx, axis=dim), idx)


@define("argsort", "reduction", aten=("aten.argsort",), flops=_sort_flops)
def argsort(self, *args, stable=None, dim=-1, descending=False):
    return sort(self, *args, stable=stable, dim=dim, descending=descending)[1]


@define("msort", "reduction", aten=("aten.msort",), flops=_sort_flops)
def msort(self):
    return sort(self, 0)[0]


@define("topk", "reduction", aten=("aten.topk",), flops=_sort_flops)
def topk(self, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) along dim, best first."""
    if self.ndim == 0:
        return np.array(self), np.zeros((), dtype=np.int64)
    idx = np.take(_order(self, dim, largest), np.arange(k), axis=dim)
    return np.take_along_axis(self, idx, axis=dim), idx


@define("kthvalue", "reduction", aten=("aten.kthvalue",), flops=_sort_flops)
def kthvalue(self, k, dim=-1, keepdim=False):
    """(value, index) of the k-th smallest along dim (k from 1)."""
    if self.ndim == 0:
        return np.array(self), np.zeros((), dtype=np.int64)
    idx = np.take(_order(self, dim, False), [k - 1], axis=dim)
    vals = np.take_along_axis(self, idx, axis=dim)
    return (vals, idx) if keepdim else (np.squeeze(vals, dim), np.squeeze(idx, dim))
