"""Random masks drawn on the host, inside a training step: SpecAugment (transformers' Wav2Vec2, HuBERT, ...).

    with host_draws_seeded():            # numpy's global generator starts from DROPOUT_SEED, then is put back
        with mask_assignments():         # x[bool_mask] = v  ->  x.copy_(where(mask, v, x)): no nonzero to trace
            loss = model(x).loss

transformers draws the SpecAugment spans with numpy's global generator (`np.random.rand`, `np.random.choice`) and
writes the masked frames with a boolean index, `hidden[mask] = embedding`. Captured, the draw is a constant of the
graph and the boolean write a `nonzero` whose size depends on the values -- which AOTAutograd cannot trace
(DynamicOutputShapeException). Under `mask_assignments` the write is the `where` it means, whose shape is the
input's. Under `host_draws_seeded` every draw starts from the generator the seeded rule uses for dropout
(DROPOUT_SEED, afresh at each step), so the constant the capture holds is the mask eager draws in each of its steps
under the same rule (runtime/train/dropout.py), and the two compare by value.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..ops.backward import DROPOUT_SEED


@contextlib.contextmanager
def host_draws_seeded():
    """numpy's global generator seeded with DROPOUT_SEED inside, its own state back after; yields a function that
    says whether anything drew from it."""
    saved = np.random.get_state()
    np.random.seed(DROPOUT_SEED)
    start = np.random.get_state()[1].copy(), np.random.get_state()[2]

    def drew() -> bool:
        now = np.random.get_state()
        return now[2] != start[1] or not np.array_equal(now[1], start[0])
    try:
        yield drew
    finally:
        np.random.set_state(saved)


def seeded_rand(func, args, kwargs):
    """torch.rand(size) / torch.rand_like(x) by the seeded rule -- numpy's generator seeded with DROPOUT_SEED, afresh
    at each call, the draw dropout's mask is cut from -- or None for any other call. A draw that decides a Python
    branch (transformers' layerdrop: `torch.rand([]) < layerdrop`) is then a constant the capture can follow, and
    the eager run under the rule takes the same branch."""
    if func is torch.rand:
        size = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)) else args
        like = None
    elif func is torch.rand_like:
        size, like = tuple(args[0].shape), args[0]
    else:
        return None
    if kwargs.get("generator") is not None or kwargs.get("out") is not None:
        return None
    dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
    draw = np.random.default_rng(DROPOUT_SEED).random(tuple(int(n) for n in size))
    return torch.from_numpy(draw).to(dtype=dtype, device=kwargs.get("device") or (like.device if like is not None
                                                                                  else "cpu"))


def _where_form(x, index, value):
    """(mask broadcast over x, value) when `x[index] = value` is a boolean-mask write `where` can say, else None."""
    if not (isinstance(index, torch.Tensor) and index.dtype == torch.bool and isinstance(x, torch.Tensor)):
        return None
    if index.ndim > x.ndim or tuple(index.shape) != tuple(x.shape[:index.ndim]):
        return None
    rest = tuple(x.shape[index.ndim:])
    v = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=x.dtype)
    # one value for every selected row (not one per selected row, which only nonzero can place)
    if v.ndim > len(rest) or (tuple(v.shape) != tuple(rest[len(rest) - v.ndim:]) and v.numel() != 1):
        return None
    return index.reshape(tuple(index.shape) + (1,) * len(rest)), v.to(x.dtype)


class mask_assignments(torch.overrides.TorchFunctionMode):
    """`x[bool_mask] = value` (a mask over x's leading dims, one value for every selected row) becomes
    `x.copy_(torch.where(mask, value, x))`, and torch.rand / rand_like draw by the seeded rule (seeded_rand); every
    other call runs as written."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        drawn = seeded_rand(func, args, kwargs)
        if drawn is not None:
            return drawn
        if func is torch.Tensor.__setitem__ and len(args) == 3 and not kwargs:
            form = _where_form(*args)
            if form is not None:
                x = args[0]
                mask, value = form
                x.copy_(torch.where(mask, value, x))
                return None
        return func(*args, **kwargs)
