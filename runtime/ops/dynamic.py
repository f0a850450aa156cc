"""Ops whose output shape depends on the values: masked_select, unique, argwhere, combinations, tensor_split by a
tensor of indices. torch.export gives their sizes as unbacked symbols; capture records those dims as 0
(runtime/capture.py `_size`), and the kernels below make arrays of the real size when they run."""
from __future__ import annotations

import itertools

import numpy as np
import torch

from ..samples import ANY, NUM, SAMPLES, B, C, F, I, Sample
from .registry import define

aten = torch.ops.aten


def _numel(n):
    return n.input_meta[0].numel if n.input_meta else 0


@define("masked_select", "copy", aten=("aten.masked_select",), flops=lambda n: 0)
def masked_select(self, mask):
    """The elements of self where mask (both broadcast) is true, in row-major order."""
    x, m = np.broadcast_arrays(self, mask)
    return x[m.astype(bool)]


def _empty():
    return np.zeros((0,), dtype=np.int64)


@define("unique", "reduction", aten=("aten._unique2",), flops=lambda n: 4 * _numel(n))
def unique(self, sorted=True, return_inverse=False, return_counts=False):
    """Sorted distinct values (ATen's CPU kernel sorts whatever `sorted` says), with the inverse mapping
    and the counts when asked; an output not asked for is an empty int64 tensor, as ATen returns."""
    values, inverse, counts = np.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    return [values.astype(self.dtype), inverse.reshape(self.shape).astype(np.int64) if return_inverse else _empty(),
            counts.astype(np.int64) if return_counts else _empty()]


def _flat_only(node):
    dim = node.kwargs.get("dim", node.args[3] if len(node.args) > 3 else None)
    return True if dim is None else "unique_consecutive: the reference kernel handles dim=None only"


@define("unique_consecutive", "reduction", aten=("aten.unique_consecutive",), flops=lambda n: _numel(n),
        accepts=_flat_only)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    """Runs of equal neighbours collapsed to one value (of the flattened input)."""
    flat = self.reshape(-1)
    starts = np.ones(flat.shape, dtype=bool)
    starts[1:] = flat[1:] != flat[:-1]
    inverse = np.cumsum(starts) - 1
    counts = np.diff(np.append(np.flatnonzero(starts), flat.size))
    return [flat[starts], inverse.reshape(self.shape).astype(np.int64) if return_inverse else _empty(),
            counts.astype(np.int64) if return_counts else _empty()]


@define("argwhere", "copy", aten=("aten.argwhere",), flops=lambda n: 0)
def argwhere(self):
    """(count, ndim) coordinates of the non-zero elements -- nonzero under its numpy name."""
    from .indexing import nonzero
    return nonzero(self)


@define("nonzero_numpy", "copy", aten=("aten.nonzero_numpy",), flops=lambda n: 0)
def nonzero_numpy(self):
    """nonzero(as_tuple=True): one 1-d index array per dim (a 0-d input counts as 1-d)."""
    return [i.astype(np.int64) for i in np.nonzero(np.atleast_1d(self))]


@define("combinations", "copy", aten=("aten.combinations",), flops=lambda n: 0)
def combinations(self, r=2, with_replacement=False):
    """Every r-element combination of a 1-d input's elements, in itertools' order, as rows."""
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    idx = np.array(list(pick(range(self.shape[0]), r)), dtype=np.int64).reshape(-1, r)
    if r == 0:
        return np.zeros((0,), dtype=self.dtype)
    return self[idx]


@define("tensor_split", "view", aten=("aten.tensor_split",))
def tensor_split(self, indices_or_sections, dim=0):
    """Split along dim at the given indices, or into n nearly equal parts (the first ones one longer)."""
    split = indices_or_sections
    if isinstance(split, np.ndarray):         # tensor_indices_or_sections: a 0-d count or 1-d indices
        split = int(split) if split.ndim == 0 else [int(i) for i in split]
    return [np.ascontiguousarray(p) for p in np.array_split(self, split, axis=dim)]


SAMPLES.update({
    "masked_select": Sample(aten.masked_select.default, [(F(4, 5), B(4, 5)), (F(3, 4), B(4)), (F(0, 3), B(0, 3))], NUM),
    "unique": Sample(aten._unique2.default, [(I(12, hi=5),), (I(3, 4, hi=4), True, True, True), (F(6), True, False, True)],
                     ANY),
    "unique_consecutive": Sample(aten.unique_consecutive.default,
                                 [(I(12, hi=3),), (I(3, 4, hi=2), True, True)], ANY),
    "argwhere": Sample(aten.argwhere.default, [(B(4, 5),), (F(3, 4),), (B(0, 3),)], ANY),
    "nonzero_numpy": Sample(aten.nonzero_numpy.default, [(B(4, 5),), (F(2, 3, 2),)], ANY),
    "combinations": Sample(aten.combinations.default, [(F(5),), (F(4), 3), C(F(3), 2, with_replacement=True)], NUM),
    "tensor_split": Sample(aten.tensor_split.sections, [(F(7, 3), 3), (F(4, 6), 4, 1),
                                                         (aten.tensor_split.indices, F(7, 3), [1, 4]),
                                                         (aten.tensor_split.tensor_indices_or_sections, F(7, 3),
                                                          I(2, lo=1, hi=6))], NUM),
})
