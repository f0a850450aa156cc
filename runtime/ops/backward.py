"""Training ops: the backward ATen ops a joint forward+backward graph holds, and the forward ops
that save what their backward needs (`native_layer_norm` returns mean and rstd, the CPU flash
attention its logsumexp). Numpy reference kernels compute in float64 and cast back; cost models
count the backward's work, so the roofline of a training step is not a forward's with extra names.

Dropout: a training graph with `native_dropout` (p > 0) draws its mask from numpy's generator
seeded with `DROPOUT_SEED`, afresh at every call (`seeded_keep`), so two opscope runs agree; eager
PyTorch draws from its own generator, so `compare_with_eager` (and `opscope train`) runs its eager
copy under the same rule (runtime/train/dropout.py) and compares by value with dropout on.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..samples import SAMPLES, B, C, F, I, Sample
from .registry import FLOATS, define
from .convolution import _convnd, _tuple

aten = torch.ops.aten
DROPOUT_SEED = 0
F32_64 = ("float32", "float64")


def _numel(n, i=0):
    return n.input_meta[i].numel if len(n.input_meta) > i else 0


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


# --- forward ops of a training graph ------------------------------------------------------
@define("native_layer_norm", "normalization", aten=("aten.native_layer_norm",), flops=lambda n: 5 * _numel(n),
        dtypes=FLOATS)
def native_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = _f64(input)
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return [out.astype(input.dtype), mean.astype(input.dtype), rstd.astype(input.dtype)]


@define("native_batch_norm", "normalization", aten=("aten._native_batch_norm_legit_functional",),
        flops=lambda n: 7 * _numel(n), dtypes=FLOATS)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm that returns its saved statistics and the updated running stats (functional)."""
    x = _f64(input)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        count = x.size // x.shape[1]
        new_mean = (1 - momentum) * _f64(running_mean) + momentum * mean
        new_var = (1 - momentum) * _f64(running_var) + momentum * var * count / max(count - 1, 1)
    else:
        mean, var = _f64(running_mean), _f64(running_var)
        new_mean, new_var = mean, var
    invstd = 1.0 / np.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _f64(weight).reshape(shape)
    if bias is not None:
        out = out + _f64(bias).reshape(shape)
    dt = input.dtype
    saved = (mean, invstd) if training else (np.zeros(0), np.zeros(0))
    return [out.astype(dt), saved[0].astype(dt), saved[1].astype(dt), new_mean.astype(running_mean.dtype),
            new_var.astype(running_var.dtype)]


@define("max_pool2d_backward", "reduction", aten=("aten.max_pool2d_with_indices_backward",),
        flops=lambda n: _numel(n), dtypes=FLOATS)
def max_pool2d_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    lead = self.shape[:-2]
    gi = np.zeros((math.prod(lead), self.shape[-2] * self.shape[-1]), dtype=np.float64)
    g = _f64(grad_output).reshape(len(gi), -1)
    idx = indices.reshape(len(gi), -1)
    np.add.at(gi, (np.arange(len(gi))[:, None], idx), g)
    return gi.reshape(self.shape).astype(self.dtype)


def _sdpa_scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _attention_scores(query, key, is_causal, attn_mask, scale):
    s = np.matmul(_f64(query), np.swapaxes(_f64(key), -1, -2)) * _sdpa_scale(query, scale)
    L, S = s.shape[-2:]
    if is_causal:
        s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf) if attn_mask.dtype == np.bool_ else s + attn_mask
    return s


def _kv_heads(query, key, value):
    """Key and value with one head per query head: grouped-query attention (fewer key/value heads, each serving
    consecutive query heads) as the CPU flash kernel takes it -- what SDPA's enable_gqa captures as in training."""
    rep = query.shape[-3] // key.shape[-3] if key.ndim >= 3 and key.shape[-3] != query.shape[-3] else 1
    return (key, value, 1) if rep == 1 else (np.repeat(key, rep, axis=-3), np.repeat(value, rep, axis=-3), rep)


def _per_kv_head(grad, rep):
    """A gradient over the repeated heads summed back onto the key/value head each group shares."""
    return grad if rep == 1 else grad.reshape(grad.shape[:-3] + (-1, rep) + grad.shape[-2:]).sum(axis=-3)


def _attention_flops(n, factor):
    q, k = n.input_meta[0].shape, n.input_meta[1].shape
    return factor * math.prod(q[:-2]) * q[-2] * k[-2] * q[-1]


@define("flash_attention", "compute", aten=("aten._scaled_dot_product_flash_attention_for_cpu",),
        flops=lambda n: _attention_flops(n, 4), dtypes=FLOATS)
def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """Attention that also returns the row logsumexp its backward recomputes probabilities from."""
    if dropout_p:
        raise NotImplementedError("attention dropout in training: set the model's attention dropout to 0")
    key, value, _ = _kv_heads(query, key, value)
    s = _attention_scores(query, key, is_causal, attn_mask, scale)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    lse = m + np.log(np.sum(np.exp(s - m), axis=-1, keepdims=True))
    out = np.matmul(np.exp(s - lse), _f64(value))
    return [out.astype(query.dtype), lse[..., 0].astype(np.float32)]


@define("flash_attention_backward", "compute", aten=("aten._scaled_dot_product_flash_attention_for_cpu_backward",),
        flops=lambda n: _attention_flops(n, 10), dtypes=FLOATS)
def flash_attention_backward(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             attn_mask=None, scale=None):
    sc = _sdpa_scale(query, scale)
    kv_dtypes = key.dtype, value.dtype
    key, value, rep = _kv_heads(query, key, value)
    p = np.exp(_attention_scores(query, key, is_causal, attn_mask, scale) - _f64(logsumexp)[..., None])
    do = _f64(grad_out)
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    dp = np.matmul(do, np.swapaxes(_f64(value), -1, -2))
    ds = p * (dp - np.sum(do * _f64(out), axis=-1, keepdims=True)) * sc
    dq = np.matmul(ds, _f64(key))
    dk = np.matmul(np.swapaxes(ds, -1, -2), _f64(query))
    return [dq.astype(query.dtype), _per_kv_head(dk, rep).astype(kv_dtypes[0]),
            _per_kv_head(dv, rep).astype(kv_dtypes[1])]


@define("nll_loss", "reduction", aten=("aten.nll_loss_forward",), flops=lambda n: _numel(n, 1), dtypes=FLOATS)
def nll_loss(self, target, weight=None, reduction=1, ignore_index=-100):
    x = _f64(self)
    x2 = x if x.ndim > 1 else x[None]
    t = target.reshape(-1)
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    w = np.ones(x2.shape[1]) if weight is None else _f64(weight)
    wt = np.where(valid, w[safe], 0.0)
    picked = -x2[np.arange(len(t)), safe] * wt
    if reduction == 0:
        return [picked.reshape(target.shape).astype(self.dtype), np.zeros((), self.dtype)]
    total = wt.sum()
    out = picked.sum() / total if reduction == 1 else picked.sum()
    return [np.asarray(out, self.dtype), np.asarray(total, self.dtype)]


@define("nll_loss_backward", "elementwise", aten=("aten.nll_loss_backward",), flops=lambda n: _numel(n, 1),
        dtypes=FLOATS)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    x2 = np.zeros(self.shape if self.ndim > 1 else (1,) + self.shape, dtype=np.float64)
    t = target.reshape(-1)
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    w = np.ones(x2.shape[1]) if weight is None else _f64(weight)
    g = _f64(grad_output).reshape(-1) if reduction == 0 else np.broadcast_to(_f64(grad_output), t.shape)
    val = -np.where(valid, w[safe], 0.0) * g
    if reduction == 1:
        val = val / _f64(total_weight)
    x2[np.arange(len(t)), safe] = val
    return x2.reshape(self.shape).astype(self.dtype)


@define("mse_loss", "reduction", aten=("aten.mse_loss",), flops=lambda n: 3 * _numel(n), dtypes=FLOATS)
def mse_loss(self, target, reduction=1):
    d = (_f64(self) - _f64(target)) ** 2
    out = d if reduction == 0 else (d.mean() if reduction == 1 else d.sum())
    return np.asarray(out).astype(self.dtype)


@define("mse_loss_backward", "elementwise", aten=("aten.mse_loss_backward",), flops=lambda n: 3 * _numel(n, 1),
        dtypes=FLOATS)
def mse_loss_backward(grad_output, self, target, reduction=1):
    g = 2.0 * (_f64(self) - _f64(target)) * _f64(grad_output)
    if reduction == 1:
        g = g / self.size
    return g.astype(self.dtype)


@define("native_dropout", "copy", aten=("aten.native_dropout",), flops=lambda n: _numel(n), dtypes=FLOATS)
def native_dropout(input, p, train=True):
    """Dropout with its mask as a second output; the mask comes from a generator seeded with
    DROPOUT_SEED (the same every call), so opscope runs are reproducible."""
    if not train or p == 0:
        return [input.copy(), np.ones(input.shape, dtype=bool)]
    keep = seeded_keep(input.shape, p)
    if p >= 1:                          # torch's p=1: every value dropped, zeros (not 0/0)
        return [np.zeros_like(input), keep]
    return [(input * keep / (1.0 - p)).astype(input.dtype), keep]


def seeded_keep(shape, p: float) -> np.ndarray:
    """The dropout rule, one place: keep where numpy's generator seeded with DROPOUT_SEED, drawn afresh over the
    input's shape at every call, gives >= p. Eager comparisons (runtime/train/dropout.py) draw the same mask."""
    return np.random.default_rng(DROPOUT_SEED).random(tuple(shape)) >= p


# --- activation backwards -----------------------------------------------------------------
@define("gelu_backward", "activation", aten=("aten.gelu_backward",), flops=lambda n: 12 * _numel(n), dtypes=FLOATS)
def gelu_backward(grad_output, self, approximate="none"):
    x = _f64(self)
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        inner = c * (x + 0.044715 * x ** 3)
        t = np.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    else:
        from .math import _erf
        cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
        d = cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return (_f64(grad_output) * d).astype(self.dtype)


@define("threshold_backward", "elementwise", aten=("aten.threshold_backward",), dtypes=FLOATS)
def threshold_backward(grad_output, self, threshold):
    """The backward of relu (threshold 0): the gradient where the input was above the threshold."""
    return np.where(self <= threshold, np.zeros((), grad_output.dtype), grad_output)


@define("tanh_backward", "elementwise", aten=("aten.tanh_backward",), flops=lambda n: 3 * _numel(n), dtypes=FLOATS)
def tanh_backward(grad_output, output):
    y = _f64(output)
    return (_f64(grad_output) * (1 - y * y)).astype(output.dtype)


@define("sigmoid_backward", "elementwise", aten=("aten.sigmoid_backward",), flops=lambda n: 3 * _numel(n),
        dtypes=FLOATS)
def sigmoid_backward(grad_output, output):
    y = _f64(output)
    return (_f64(grad_output) * y * (1 - y)).astype(output.dtype)


@define("silu_backward", "activation", aten=("aten.silu_backward",), flops=lambda n: 8 * _numel(n), dtypes=FLOATS)
def silu_backward(grad_output, self):
    x = _f64(self)
    s = 1.0 / (1.0 + np.exp(-x))
    return (_f64(grad_output) * s * (1 + x * (1 - s))).astype(self.dtype)


@define("hardswish_backward", "activation", aten=("aten.hardswish_backward",), flops=lambda n: 4 * _numel(n),
        dtypes=FLOATS)
def hardswish_backward(grad_output, self):
    """d/dx x*relu6(x+3)/6: 0 below -3, x/3 + 1/2 up to 3 (ATen's boundaries, inclusive there), 1 above."""
    x, g = _f64(self), _f64(grad_output)
    return np.where(x < -3.0, 0.0, np.where(x <= 3.0, g * (x / 3.0 + 0.5), g)).astype(grad_output.dtype)


@define("hardsigmoid_backward", "activation", aten=("aten.hardsigmoid_backward",), flops=lambda n: 2 * _numel(n),
        dtypes=FLOATS)
def hardsigmoid_backward(grad_output, self):
    """1/6 of the gradient strictly inside (-3, 3), 0 outside (ATen's boundaries)."""
    x = _f64(self)
    return np.where((x > -3.0) & (x < 3.0), _f64(grad_output) / 6.0, 0.0).astype(grad_output.dtype)


@define("native_dropout_backward", "elementwise", aten=("aten.native_dropout_backward",),
        flops=lambda n: 2 * _numel(n), dtypes=FLOATS)
def native_dropout_backward(grad_output, mask, scale):
    """The gradient where the forward's mask kept a value, times the forward's 1/(1-p)."""
    return (_f64(grad_output) * mask * scale).astype(grad_output.dtype)


@define("weight_norm_interface_backward", "normalization", aten=("aten._weight_norm_interface_backward",),
        flops=lambda n: 6 * _numel(n), dtypes=FLOATS)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """(grad v, grad g) of w = g * v / ||v|| (Wav2Vec2's positional conv): grad g = sum(grad_w * v) / norm over
    every dim but `dim`, grad v = g / norm * (grad_w - v * grad_g / norm), from the forward's saved norms."""
    dim = dim % saved_v.ndim
    axes = tuple(a for a in range(saved_v.ndim) if a != dim)
    gw, v = _f64(grad_w), _f64(saved_v)
    norm = _f64(saved_norms).reshape([saved_v.shape[dim] if a == dim else 1 for a in range(saved_v.ndim)])
    grad_g = (gw * v).sum(axis=axes, keepdims=True) / norm
    grad_v = _f64(saved_g).reshape(norm.shape) / norm * (gw - v * grad_g / norm)
    return [grad_v.astype(saved_v.dtype), grad_g.reshape(saved_g.shape).astype(saved_g.dtype)]


# --- normalization and softmax backwards ---------------------------------------------------
@define("layer_norm_backward", "normalization", aten=("aten.native_layer_norm_backward",),
        flops=lambda n: 10 * _numel(n), dtypes=FLOATS)
def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    axes = tuple(range(input.ndim - k, input.ndim))
    lead = tuple(range(input.ndim - k))
    g, x = _f64(grad_out), _f64(input)
    xhat = (x - _f64(mean)) * _f64(rstd)
    gx = g * _f64(weight) if weight is not None else g
    n = math.prod(input.shape[input.ndim - k:])
    dx = _f64(rstd) / n * (n * gx - gx.sum(axis=axes, keepdims=True)
                           - xhat * (gx * xhat).sum(axis=axes, keepdims=True)) if output_mask[0] else None
    dw = (g * xhat).sum(axis=lead) if output_mask[1] and weight is not None else None
    db = g.sum(axis=lead) if output_mask[2] and bias is not None else None
    return [None if v is None else v.astype(input.dtype) for v in (dx, dw, db)]


@define("batch_norm_backward", "normalization", aten=("aten.native_batch_norm_backward",),
        flops=lambda n: 10 * _numel(n), dtypes=FLOATS)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                        output_mask):
    shape = (1, -1) + (1,) * (input.ndim - 2)
    axes = (0,) + tuple(range(2, input.ndim))
    g, x = _f64(grad_out), _f64(input)
    if train:
        mean, invstd = _f64(save_mean), _f64(save_invstd)
    else:
        mean, invstd = _f64(running_mean), 1.0 / np.sqrt(_f64(running_var) + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    w = _f64(weight).reshape(shape) if weight is not None else 1.0
    n = x.size // x.shape[1]
    dx = None
    if output_mask[0]:
        if train:
            dx = w * invstd.reshape(shape) / n * (n * g - g.sum(axis=axes).reshape(shape)
                                                  - xhat * (g * xhat).sum(axis=axes).reshape(shape))
        else:
            dx = g * w * invstd.reshape(shape)
    dw = (g * xhat).sum(axis=axes) if output_mask[1] else None
    db = g.sum(axis=axes) if output_mask[2] else None
    return [None if v is None else np.asarray(v).astype(input.dtype) for v in (dx, dw, db)]


@define("softmax_backward", "normalization", aten=("aten._softmax_backward_data",), flops=lambda n: 4 * _numel(n),
        dtypes=FLOATS)
def softmax_backward(grad_output, output, dim, input_dtype=None):
    y, g = _f64(output), _f64(grad_output)
    return (y * (g - (g * y).sum(axis=dim, keepdims=True))).astype(grad_output.dtype)


@define("safe_softmax", "normalization", aten=("aten._safe_softmax",), flops=lambda n: 5 * _numel(n), dtypes=FLOATS)
def safe_softmax(self, dim, dtype=None):
    """softmax, except that a row whose every input is -inf gives zeros instead of NaN (what attention with a
    fully masked row needs; T5 and Swin capture their softmax as this)."""
    from ..dtypes import to_numpy
    from .nn import _softmax
    x = self.astype(to_numpy(dtype)) if dtype is not None else self
    with np.errstate(invalid="ignore"):        # the dead rows' 0/0, replaced just below
        out = _softmax(_f64(x), dim)
    dead = np.all(np.isneginf(x), axis=dim, keepdims=True)
    return np.where(dead, 0.0, out).astype(x.dtype)


@define("log_softmax_backward", "normalization", aten=("aten._log_softmax_backward_data",),
        flops=lambda n: 4 * _numel(n), dtypes=FLOATS)
def log_softmax_backward(grad_output, output, dim, input_dtype=None):
    g = _f64(grad_output)
    return (g - np.exp(_f64(output)) * g.sum(axis=dim, keepdims=True)).astype(grad_output.dtype)


# --- convolution, pooling, embedding backwards ---------------------------------------------
def _conv_backward_flops(n):
    w = n.input_meta[2].shape
    return 4 * n.input_meta[0].numel * math.prod(w[1:])     # grad input + grad weight, each a conv


@define("convolution_backward", "compute", aten=("aten.convolution_backward",), flops=_conv_backward_flops,
        dtypes=FLOATS)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    nd = input.ndim - 2
    stride, padding, dilation = _tuple(stride, nd), _tuple(padding, nd), _tuple(dilation, nd)
    if transposed:
        # A transposed convolution is the input-gradient of the direct one with the same weight, so its
        # backward is the direct convolution's with roles swapped: grad input = conv(grad_output, weight);
        # grad weight = the direct grad weight with grad_output as that conv's input and input as its grad.
        g = _f64(grad_output)
        dx = _convnd(g, _f64(weight), None, stride, [(p, p) for p in padding], dilation, groups, nd) \
            if output_mask[0] else None
        dw = _direct_backward(_f64(input), g, _f64(weight), stride, padding, dilation, groups, False,
                              output_mask[1])[1]
    else:
        dx, dw = _direct_backward(_f64(grad_output), _f64(input), _f64(weight), stride, padding, dilation, groups,
                                  output_mask[0], output_mask[1])
    db = _f64(grad_output).sum(axis=(0,) + tuple(range(2, grad_output.ndim))) if output_mask[2] else None
    return [None if v is None else np.ascontiguousarray(v).astype(input.dtype) for v in (dx, dw, db)]


def _direct_backward(g, input, w, stride, padding, dilation, groups, need_dx, need_dw):
    """(grad input, grad weight) of a direct convolution, float64, from grad_output `g`."""
    x = np.pad(input, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    cout, cg = w.shape[:2]
    cog = cout // groups
    out_sz = g.shape[2:]
    dx = np.zeros_like(x) if need_dx else None
    dw = np.zeros_like(w) if need_dw else None
    # One strided slice of the padded input per kernel tap: the im2col columns, without copying.
    for tap in np.ndindex(*w.shape[2:]):
        sl = tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in zip(tap, dilation, stride, out_sz))
        for grp in range(groups):
            ci, co = slice(grp * cg, (grp + 1) * cg), slice(grp * cog, (grp + 1) * cog)
            gg = g[:, co]                                    # N, cog, *out
            wt = w[(co, slice(None)) + tap]                  # cog, cg (weights hold one group's inputs)
            if dw is not None:
                red = [0] + list(range(2, g.ndim))
                dw[(co, slice(None)) + tap] += np.tensordot(gg, x[(slice(None), ci) + sl], axes=(red, red))
            if dx is not None:
                dx[(slice(None), ci) + sl] += np.moveaxis(np.tensordot(gg, wt, axes=([1], [0])), -1, 1)
    if dx is not None:
        dx = dx[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, input.shape[2:]))]
    return dx, dw


@define("embedding_backward", "reduction", aten=("aten.embedding_dense_backward",), flops=lambda n: _numel(n),
        dtypes=FLOATS)
def embedding_backward(grad_output, indices, num_weights, padding_idx=-1, scale_grad_by_freq=False):
    d = grad_output.shape[-1]
    idx = indices.reshape(-1)
    g = _f64(grad_output).reshape(-1, d)
    if scale_grad_by_freq:
        counts = np.bincount(idx, minlength=num_weights)
        g = g / counts[idx][:, None]
    out = np.zeros((num_weights, d))
    np.add.at(out, idx, g)
    if padding_idx >= 0:
        out[padding_idx] = 0
    return out.astype(grad_output.dtype)


@define("adaptive_avg_pool2d_backward", "reduction", aten=("aten._adaptive_avg_pool2d_backward",),
        flops=lambda n: _numel(n, 1), dtypes=FLOATS)
def adaptive_avg_pool2d_backward(grad_output, self):
    h, w = self.shape[-2:]
    oh, ow = grad_output.shape[-2:]
    out = np.zeros(self.shape, dtype=np.float64)
    g = _f64(grad_output)
    for i in range(oh):
        h0, h1 = math.floor(i * h / oh), math.ceil((i + 1) * h / oh)
        for j in range(ow):
            w0, w1 = math.floor(j * w / ow), math.ceil((j + 1) * w / ow)
            out[..., h0:h1, w0:w1] += g[..., i:i + 1, j:j + 1] / ((h1 - h0) * (w1 - w0))
    return out.astype(self.dtype)


# --- conformance samples (registered into runtime/samples.SAMPLES) --------------------------
BACKWARD_SAMPLES = {
    "native_layer_norm": Sample(aten.native_layer_norm.default, [(F(4, 6), [6], F(6), F(6), 1e-5),
                                                                 (F(2, 3, 4), [3, 4], None, None, 1e-5)], F32_64),
    "native_batch_norm": Sample(aten._native_batch_norm_legit_functional.default,
                                [(F(4, 3, 5, 5), F(3), F(3), F(3), F(3, lo=0.5), True, 0.1, 1e-5),
                                 (F(4, 3, 5, 5), F(3), F(3), F(3), F(3, lo=0.5), False, 0.1, 1e-5)], F32_64),
    "max_pool2d_backward": Sample(aten.max_pool2d_with_indices_backward.default,
                                  [(F(2, 3, 4, 4), F(2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False,
                                    I(2, 3, 4, 4, hi=64))], F32_64),
    "flash_attention": Sample(aten._scaled_dot_product_flash_attention_for_cpu.default,
                              [(F(2, 2, 5, 8), F(2, 2, 5, 8), F(2, 2, 5, 8)),
                               (F(1, 2, 6, 4), F(1, 2, 6, 4), F(1, 2, 6, 4), 0.0, True),
                               (F(1, 4, 5, 8), F(1, 2, 5, 8), F(1, 2, 5, 8), 0.0, True)], F32_64),    # grouped kv heads
    "flash_attention_backward": Sample(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                                       [(F(1, 2, 6, 4), F(1, 2, 6, 4), F(1, 2, 6, 4), F(1, 2, 6, 4), F(1, 2, 6, 4),
                                         F(1, 2, 6, lo=1.0, hi=2.0), 0.0, True),
                                        (F(1, 4, 6, 4), F(1, 4, 6, 4), F(1, 2, 6, 4), F(1, 2, 6, 4), F(1, 4, 6, 4),
                                         F(1, 4, 6, lo=1.0, hi=2.0), 0.0, True)], F32_64),
    "nll_loss": Sample(aten.nll_loss_forward.default, [(F(6, 5), I(6, hi=5), None, 1, -100),
                                                       (F(6, 5), I(6, hi=5), F(5, lo=0.5), 2, 1),
                                                       (F(6, 5), I(6, hi=5), None, 0, -100)], F32_64),
    "nll_loss_backward": Sample(aten.nll_loss_backward.default,
                                [(F(), F(6, 5), I(6, hi=5), None, 1, -100, F(lo=1.0, hi=3.0)),
                                 (F(6), F(6, 5), I(6, hi=5), None, 0, 2, F())], F32_64),
    "mse_loss": Sample(aten.mse_loss.default, [(F(4, 5), F(4, 5)), (F(4, 5), F(4, 5), 2), (F(3), F(3), 0)]),
    "mse_loss_backward": Sample(aten.mse_loss_backward.default, [(F(), F(4, 5), F(4, 5), 1),
                                                                 (F(4, 5), F(4, 5), F(4, 5), 0)]),
    "native_dropout": Sample(aten.native_dropout.default, [(F(4, 5), 0.0, True), (F(4, 5), 0.5, False)]),
    "gelu_backward": Sample(aten.gelu_backward.default, [(F(4, 5), F(4, 5)), C(F(4, 5), F(4, 5), approximate="tanh")]),
    "threshold_backward": Sample(aten.threshold_backward.default, [(F(4, 5), F(4, 5), 0.0), (F(3, 2), F(3, 2), 0.5)]),
    "tanh_backward": Sample(aten.tanh_backward.default, [(F(4, 5), F(4, 5, lo=-1.0, hi=1.0))]),
    "sigmoid_backward": Sample(aten.sigmoid_backward.default, [(F(4, 5), F(4, 5, lo=0.0, hi=1.0))]),
    "silu_backward": Sample(aten.silu_backward.default, [(F(4, 5), F(4, 5))]),
    "hardswish_backward": Sample(aten.hardswish_backward.default,
                                 [(F(4, 5), F(4, 5, lo=-4, hi=4)), (F(7), F(7, lo=-4, hi=4))], F32_64),
    "hardsigmoid_backward": Sample(aten.hardsigmoid_backward.default,
                                   [(F(4, 5), F(4, 5, lo=-4, hi=4)), (F(7), F(7, lo=-4, hi=4))], F32_64),
    "weight_norm_interface_backward": Sample(aten._weight_norm_interface_backward.default,
                                             [(F(4, 3), F(4, 3), F(4, 1), F(4, 1, lo=0.5), 0),
                                              (F(4, 3, 5), F(4, 3, 5), F(1, 1, 5), F(1, 1, 5, lo=0.5), 2)], F32_64),
    "native_dropout_backward": Sample(aten.native_dropout_backward.default,
                                      [(F(4, 5), B(4, 5), 2.0), (F(3, 2), B(3, 2), 1.0)], F32_64),
    "safe_softmax": Sample(aten._safe_softmax.default,
                           [(F(4, 5), 1), (F(2, 3, 4), -1), (F(2, 3, 4), 0, torch.float32), (F(0, 3), -1)], F32_64),
    "layer_norm_backward": Sample(aten.native_layer_norm_backward.default,
                                  [(F(4, 6), F(4, 6), [6], F(4, 1), F(4, 1, lo=0.5), F(6), F(6), [True, True, True]),
                                   (F(2, 3, 4), F(2, 3, 4), [3, 4], F(2, 1, 1), F(2, 1, 1, lo=0.5), F(3, 4), F(3, 4),
                                    [True, True, True])], F32_64),
    "batch_norm_backward": Sample(aten.native_batch_norm_backward.default,
                                  [(F(4, 3, 5), F(4, 3, 5), F(3), F(3), F(3, lo=0.5), F(3), F(3, lo=0.5), True, 1e-5,
                                    [True, True, True]),
                                   (F(4, 3, 5), F(4, 3, 5), F(3), F(3), F(3, lo=0.5), F(3), F(3, lo=0.5), False, 1e-5,
                                    [True, True, True])], F32_64),
    "softmax_backward": Sample(aten._softmax_backward_data.default,
                               [(F(4, 5), F(4, 5, lo=0.0, hi=1.0), 1, torch.float32),
                                (F(2, 3, 4), F(2, 3, 4, lo=0.0, hi=1.0), 0, torch.float32)], ("float32",)),
    "log_softmax_backward": Sample(aten._log_softmax_backward_data.default,
                                   [(F(4, 5), F(4, 5, lo=-3.0, hi=0.0), 1, torch.float32)], ("float32",)),
    "convolution_backward": Sample(aten.convolution_backward.default,
                                   [(F(2, 4, 6, 6), F(2, 3, 8, 8), F(4, 3, 3, 3), [4], [1, 1], [0, 0], [1, 1], False,
                                     [0, 0], 1, [True, True, True]),
                                    (F(2, 4, 4, 4), F(2, 4, 8, 8), F(4, 2, 3, 3), [4], [2, 2], [1, 1], [1, 1], False,
                                     [0, 0], 2, [True, True, True]),
                                    # transposed (UNet's up path): grouped, strided, padded, output-padded
                                    (F(2, 4, 10, 10), F(2, 4, 5, 5), F(4, 2, 3, 3), [4], [2, 2], [1, 1], [1, 1], True,
                                     [1, 1], 2, [True, True, True])], F32_64),
    "embedding_backward": Sample(aten.embedding_dense_backward.default,
                                 [(F(3, 4, 5), I(3, 4, hi=7), 7, -1, False), (F(6, 5), I(6, hi=7), 7, 2, True)], F32_64),
    "adaptive_avg_pool2d_backward": Sample(aten._adaptive_avg_pool2d_backward.default,
                                           [(F(2, 3, 1, 1), F(2, 3, 4, 4)), (F(1, 2, 3, 2), F(1, 2, 7, 5))], F32_64),
}
SAMPLES.update(BACKWARD_SAMPLES)    # NOTE: conformance reads SAMPLES; new op modules add their own entries
