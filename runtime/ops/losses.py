"""Losses and the activation they are built on that ATen defines as compositions: log_sigmoid and
binary_cross_entropy_with_logits -- numpy reference kernels, computed in float64 with the stable formulas."""
from __future__ import annotations

import numpy as np
import torch

from ..samples import FLOAT, NC, SAMPLES, C, F, Sample
from .registry import FLOATS, define

aten = torch.ops.aten
_REDUCE = {0: lambda x: x, 1: np.mean, 2: np.sum}     # ATen's Reduction enum: none, mean, sum


def _log_sigmoid(x):
    # log(1 / (1 + e^-x)) = -log(1 + e^-x), without overflow for large |x|
    return -np.logaddexp(0.0, -x)


@define("log_sigmoid", "activation", aten=("aten.log_sigmoid",), flops=lambda n: 4 * n.output_meta[0].numel,
        dtypes=FLOATS)
def log_sigmoid(self):
    return _log_sigmoid(self.astype(np.float64))


@define("binary_cross_entropy_with_logits", "reduction", aten=("aten.binary_cross_entropy_with_logits",),
        flops=lambda n: 8 * n.input_meta[0].numel, dtypes=FLOATS)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    """(1 - t) x - w_pos(t) log_sigmoid(x), times weight, reduced; w_pos(t) = (pos_weight - 1) t + 1 (1 without one)."""
    x, t = self.astype(np.float64), np.asarray(target, dtype=np.float64)
    scale = 1.0 if pos_weight is None else (np.asarray(pos_weight, dtype=np.float64) - 1.0) * t + 1.0
    loss = (1.0 - t) * x - scale * _log_sigmoid(x)
    if weight is not None:
        loss = loss * weight
    return _REDUCE[int(reduction)](loss)


SAMPLES.update({
    "log_sigmoid": Sample(aten.log_sigmoid.default, [(F(4, 5, lo=-30, hi=30),), (F(2, 0, 3),), (NC(3, 6),)], FLOAT),
    "binary_cross_entropy_with_logits": Sample(
        aten.binary_cross_entropy_with_logits.default,
        [(F(4, 5), F(4, 5, lo=0, hi=1)), C(F(3, 4), F(3, 4, lo=0, hi=1), F(4, lo=0.5), F(4, lo=0.5), reduction=2),
         C(NC(3, 4), F(3, 4, lo=0, hi=1), reduction=0)], FLOAT),
})
