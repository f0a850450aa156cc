"""Random tensors: rand, randn, randperm and friends, drawn from numpy's generator.

Their values are random by definition: conformance and the OpInfo check compare shape and dtype
only. A backend that must reproduce PyTorch's stream runs them on torch.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy
from .registry import define

_RNG = np.random.default_rng()


def _dtype(dtype, default="float32"):
    return to_numpy(dtype) if dtype is not None else np.dtype(default)


@define("rand", "creation", aten=("aten.rand",))
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    """Uniform in [0, 1)."""
    return _RNG.random(tuple(size)).astype(_dtype(dtype))


@define("randn", "creation", aten=("aten.randn",))
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    """Standard normal."""
    return _RNG.standard_normal(tuple(size)).astype(_dtype(dtype))


@define("randperm", "creation", aten=("aten.randperm",))
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _RNG.permutation(n).astype(_dtype(dtype, "int64"))


@define("rand_like", "creation", aten=("aten.rand_like",))
def rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _RNG.random(self.shape).astype(_dtype(dtype, self.dtype.name))


@define("randn_like", "creation", aten=("aten.randn_like",))
def randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _RNG.standard_normal(self.shape).astype(_dtype(dtype, self.dtype.name))


@define("bernoulli", "creation", aten=("aten.bernoulli",))
def bernoulli(self, p=None, *, generator=None):
    """1 with probability p (self holds the probabilities when p is not given)."""
    prob = self if p is None else np.broadcast_to(p, self.shape)
    return (_RNG.random(self.shape) < prob).astype(self.dtype)
