"""Grouped matmul: the mixture-of-experts product, one weight matrix per expert.

transformers 5.x runs a MoE layer's experts (Mixtral, Qwen-MoE, ...) as one grouped matmul over the tokens sorted by
expert: `transformers::grouped_mm_fallback(input (S, K), weight (E, K, N), offs (E,))` whenever torch's own
`grouped_mm` is not usable (always under a trace in float32), and its autograd calls
`transformers::grouped_mm_fallback_backward` -- both custom ops with a Python loop as their only kernel, so without
these a numpy or sim backend could not run (or train) the model at all.

The kernels follow transformers' loop exactly (integrations/moe.py), including its edge cases: group i is the rows
`offs[i-1]:offs[i]` (clipped to S, empty when an offset does not grow), it overwrites those rows, and rows no group
reaches stay zero. They are mapped by the custom ops' names, so capture needs no import of transformers.

NOTE: kind "custom": a library's op, like `@operator` ones -- conformance's ATen samples cannot name it without
importing transformers; tests/test_train_decoders.py checks both kernels against transformers' definitions.
"""
from __future__ import annotations

import numpy as np

from .registry import FLOATS, define


def _groups(offs, rows: int):
    """(expert, start, end) of each non-empty group, as transformers' loop walks them."""
    start = 0
    for i, end in enumerate(int(e) for e in np.asarray(offs).reshape(-1)):
        if start == end:
            continue
        lo, hi = min(start, rows), min(end, rows)
        if hi > lo:
            yield i, lo, hi
        start = end


def _flops(n):
    """2*K*N per routed row: the dense work of the experts, not of every expert on every row."""
    (s, k), n_out = n.input_meta[0].shape, n.input_meta[1].shape[-1]
    return 2 * s * k * n_out


def _takes(n):
    x, w, offs = (n.input_meta + [None] * 3)[:3]
    if x is None or w is None or offs is None or len(x.shape) != 2 or len(w.shape) != 3 or len(offs.shape) != 1:
        return f"{n.op}: needs input (S, K), weight (E, K, N) and offs (E,)"
    return True


@define("grouped_mm", "custom", aten=("transformers.grouped_mm_fallback",), flops=_flops, dtypes=FLOATS, accepts=_takes)
def grouped_mm(input, weight, offs):
    """Rows offs[i-1]:offs[i] of input times weight[i] (transformers::grouped_mm_fallback); rows no group reaches
    are zero."""
    out = np.zeros((input.shape[0], weight.shape[2]), dtype=input.dtype)
    for i, lo, hi in _groups(offs, input.shape[0]):
        out[lo:hi] = input[lo:hi] @ weight[i]
    return out


@define("grouped_mm_backward", "custom", aten=("transformers.grouped_mm_fallback_backward",),
        flops=lambda n: 2 * _flops(n), dtypes=FLOATS, accepts=_takes)
def grouped_mm_backward(input, weight, offs, grad_output):
    """(grad_input, grad_weight) of grouped_mm: per group, grad_output @ weight[i].T and input.T @ grad_output
    (transformers::grouped_mm_fallback_backward); an expert no row reaches gets a zero gradient."""
    grad_input, grad_weight = np.zeros_like(input), np.zeros_like(weight)
    for i, lo, hi in _groups(offs, input.shape[0]):
        grad_input[lo:hi] = grad_output[lo:hi] @ weight[i].T
        grad_weight[i] = input[lo:hi].T @ grad_output[lo:hi]
    return [grad_input, grad_weight]
