"""Eager PyTorch with opscope's dropout mask, so a training comparison with dropout on compares like with like.

    with seeded_dropout():
        loss = model(x).loss          # every F.dropout / nn.Dropout keeps where seeded_keep(shape, p), and attention
                                      # with dropout_p drops its weights (..., L, S) by that mask

opscope's `native_dropout` kernel draws its mask from numpy's generator seeded with DROPOUT_SEED, afresh at every
call (ops/backward.py: seeded_keep), so runs repeat exactly; eager PyTorch draws from torch's stream, so the two
never agree by value. Under this mode eager's dropout draws opscope's mask instead, and every other op runs as
eager runs it: the loss and every parameter then match within float32 rounding, with dropout on.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..ops.backward import seeded_keep
from .masks import host_draws_seeded, seeded_rand

# The Python entry points that reach ATen's dropout (what the joint capture turns into native_dropout), and how
# each spells its arguments.
_F_DROPOUT = ("input", "p", "training", "inplace")
_ATEN_DROPOUT = ("input", "p", "train")
_DROPOUTS = {F.dropout: _F_DROPOUT, torch.dropout: _ATEN_DROPOUT, torch.dropout_: _ATEN_DROPOUT,
             torch.native_dropout: _ATEN_DROPOUT}


class seeded_dropout(torch.overrides.TorchFunctionMode):
    """Within it, dropout (p, training) keeps where seeded_keep(shape, p) and scales the kept values by 1/(1-p).
    `drew` says whether any dropout drew a mask (p > 0, training): a mode sees every torch call (about 10% of an
    eager step), so a caller may leave it off where the model has no live dropout."""

    def __init__(self):
        super().__init__()
        self.drew = False
        self._quiet = None

    def __enter__(self):
        # host-drawn masks (SpecAugment's numpy spans) start from the rule's seed too, as the capture's did
        self._host = host_draws_seeded()
        self._host_drew = self._host.__enter__()
        # ATen warns that an explicit attention dropout mask is "for testing purposes": a comparison is what this
        # is. The warning reaches Python when the model's attention call returns, so the filter spans the mode.
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message="Dropout mask should only be used", category=UserWarning)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._quiet.__exit__(*exc)
            self.drew = self.drew or self._host_drew()
            self._host.__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        drawn = seeded_rand(func, args, kwargs)       # as the capture draws it (train/masks.py)
        if drawn is not None:
            self.drew = True
            return drawn
        names = _DROPOUTS.get(func)
        if names is None:
            return func(*args, **kwargs)
        bound = {"p": 0.5, "training": True, "train": True, "inplace": func is torch.dropout_, **dict(zip(names, args)),
                 **kwargs}
        x, p = bound["input"], float(bound["p"])
        train = bound["training"] if names is _F_DROPOUT else bound["train"]
        if not train or p == 0:
            out, keep = x, torch.ones(x.shape, dtype=torch.bool, device=x.device)
        else:
            keep = torch.from_numpy(seeded_keep(x.shape, p)).to(x.device)
            self.drew = True
            out = x.mul_(keep).div_(1.0 - p) if bound["inplace"] else x * keep / (1.0 - p)
        return (out, keep) if func is torch.native_dropout else out

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        """Attention with dropout: the joint capture makes it ATen's math form, whose native_dropout over the
        weights (..., L, S) draws the seeded mask; eager runs that form with the same mask. Without dropout it is
        the model's own call, untouched."""
        if not dropout_p:
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                                  enable_gqa=enable_gqa)
        heads = query.shape[:-2] if enable_gqa else torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        keep = torch.from_numpy(seeded_keep((*heads, query.shape[-2], key.shape[-2]), dropout_p)).to(query.device)
        self.drew = True
        return torch.ops.aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                                 keep, scale=scale, enable_gqa=enable_gqa)[0]
