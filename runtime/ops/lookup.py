"""Membership and lookup: isin, take, bucketize, searchsorted, isclose -- numpy reference kernels (each a compare or
a binary search per element)."""
from __future__ import annotations

import numpy as np
import torch

from ..samples import ANY, NUM, SAMPLES, C, D, F, I, Sample
from .registry import define

aten = torch.ops.aten


def _log2(n):
    return max(1, int(np.ceil(np.log2(max(n, 2)))))


@define("isin", "elementwise", aten=("aten.isin",),
        flops=lambda n: sum(m.numel for m in n.input_meta) * _log2(n.input_meta[-1].numel if n.input_meta else 1))
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    return np.isin(np.asarray(elements), np.asarray(test_elements), invert=invert)


@define("take", "copy", aten=("aten.take",), flops=lambda n: 0)
def take(self, index):
    """self's elements in row-major order at index (negative counts from the end), in index's shape."""
    flat = np.asarray(self).reshape(-1)
    return flat[np.asarray(index) % max(flat.size, 1)] if flat.size else flat[np.asarray(index)]


def _search(sequence, values, side, sorter=None):
    sequence, values = np.asarray(sequence), np.asarray(values)
    if sorter is not None:
        sequence = np.take_along_axis(sequence, np.asarray(sorter), axis=-1)
    if sequence.ndim <= 1:
        return np.searchsorted(sequence, values, side=side)
    out = np.empty(values.shape, dtype=np.int64)
    for i in np.ndindex(*sequence.shape[:-1]):
        out[i] = np.searchsorted(sequence[i], values[i], side=side)
    return out


@define("bucketize", "elementwise", aten=("aten.bucketize",),
        flops=lambda n: (n.input_meta[0].numel if n.input_meta else 1) * _log2(n.input_meta[-1].numel))
def bucketize(self, boundaries, *, out_int32=False, right=False):
    """The bucket of each value: boundaries[i-1] < x <= boundaries[i] (right: boundaries[i-1] <= x < boundaries[i])."""
    return np.searchsorted(np.asarray(boundaries), np.asarray(self), side="right" if right else "left")


@define("searchsorted", "elementwise", aten=("aten.searchsorted",),
        flops=lambda n: n.output_meta[0].numel * _log2(n.input_meta[0].numel))
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    """Where each value would go in its row of sorted_sequence (side, when given, over right)."""
    return _search(sorted_sequence, self, side or ("right" if right else "left"), sorter)


@define("isclose", "elementwise", aten=("aten.isclose",), flops=lambda n: 4 * n.output_meta[0].numel)
def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|self - other| <= atol + rtol |other|, infinities equal only to themselves."""
    return np.isclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan)


SAMPLES.update({
    "isin": Sample(aten.isin.Tensor_Tensor, [(I(4, 5, hi=9), I(6, hi=9)), C(I(3, 4, hi=5), I(2, hi=5), invert=True),
                                             (aten.isin.Tensor_Scalar, I(3, 4, hi=3), 1)], ANY),
    "take": Sample(aten.take.default, [(F(4, 5), I(6, hi=20)), (F(3, 4), I(2, 3, lo=-12, hi=12))], NUM),
    "bucketize": Sample(aten.bucketize.Tensor, [(F(4, 5), D(6)), C(F(3, 4), D(5), right=True, out_int32=True)], ANY),
    "searchsorted": Sample(aten.searchsorted.Tensor, [(D(6), F(4, 5)), C(D(6), F(3, 4), side="right")], ANY),
    "isclose": Sample(aten.isclose.default, [(F(4, 5), F(4, 5)), (F(3, 4), F(3, 4), 0.5, 0.5)], NUM),
})
