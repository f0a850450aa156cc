"""Backwards of views: the gradient of a slice, a select or an as_strided view is zeros in the input's
shape with the gradient scattered where the view looked.

`slice_backward` and `select_backward` are compositions (zeros + the scatter op the op set already has),
defined once here, so every backend runs them through its own `new_zeros` and `slice_scatter` /
`select_scatter` kernels (runtime/decompose.py); a backend with a kernel of its own (torch) runs that.
The `_unsafe_index` family (what upsampling and its backward capture as) is `index` / `index_put`
without bounds checks: the same ops.
"""
from __future__ import annotations

import numpy as np
import torch

from ..samples import NUM, SAMPLES, F, I, Sample
from .registry import alias, composition, define

aten = torch.ops.aten


def _grad_numel(n):
    return n.input_meta[0].numel if n.input_meta else 0


@composition("slice_backward", "copy", aten=("aten.slice_backward",), flops=lambda n: 0)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    """Zeros of the input's shape with the gradient in the sliced part."""
    return torch.slice_scatter(grad_output.new_zeros(input_sizes), grad_output, dim, start, end, step)


@composition("select_backward", "copy", aten=("aten.select_backward",), flops=lambda n: 0)
def select_backward(grad_output, input_sizes, dim, index):
    """Zeros of the input's shape with the gradient at the selected index."""
    return torch.select_scatter(grad_output.new_zeros(input_sizes), grad_output, dim, index)


@define("as_strided_scatter", "copy", aten=("aten.as_strided_scatter",))
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """self with the as_strided view (size, stride, storage_offset over its elements in row-major order)
    replaced by src -- the functional form of `x.as_strided(...).copy_(src)`."""
    out = np.array(self, copy=True, order="C")
    flat = out.reshape(-1)
    view = np.lib.stride_tricks.as_strided(flat[storage_offset or 0:], tuple(size),
                                           tuple(s * flat.itemsize for s in stride))
    view[...] = src          # NOTE: overlapping views write the last value, as ATen's copy_ does on CPU
    return out


alias("index", "aten._unsafe_index")
alias("index_put", "aten._unsafe_index_put")

SAMPLES.update({
    "slice_backward": Sample(aten.slice_backward.default,
                             [(F(2, 5), [6, 5], 0, 1, 3, 1), (F(6, 2), [6, 5], 1, 0, 4, 2),
                              (F(2, 3, 2), [2, 3, 8], -1, 6, 9223372036854775807, 1), (F(0, 5), [4, 5], 0, 2, 2, 1)],
                             NUM),
    "select_backward": Sample(aten.select_backward.default,
                              [(F(5), [4, 5], 0, 2), (F(4), [4, 5], -1, -1), (F(2, 4), [2, 3, 4], 1, 0)], NUM),
    "as_strided_scatter": Sample(aten.as_strided_scatter.default,
                                 [(F(4, 5), F(3, 3), [3, 3], [5, 1]), (F(4, 5), F(2, 2), [2, 2], [1, 5], 3),
                                  (F(2, 3, 4), F(2, 4, 3), [2, 4, 3], [12, 1, 4])], NUM),
})
# the unsafe spellings go through the same kernels: their conformance cases join those ops' own
SAMPLES["index"].cases.append((aten._unsafe_index.Tensor, F(2, 3, 4), [None, I(2, 2, hi=3)]))
SAMPLES["index_put"].cases.append((aten._unsafe_index_put.default, F(5, 4), [I(3, hi=5)], F(3, 4), True))
