"""Neural-network ops (linear algebra, convolution, pooling, normalization, attention,
embedding, softmax): numpy reference kernels and their cost models."""
from __future__ import annotations

import math

import numpy as np

from .registry import FLOATS, define


def _matmul_flops(n):
    a, b = n.input_meta[0].shape, n.input_meta[1].shape
    k = a[-1] if a else 1
    return 2 * n.output_meta[0].numel * k


def _linear_flops(n):
    k = n.input_meta[0].shape[-1] if n.input_meta[0].shape else 1
    return 2 * n.output_meta[0].numel * k + (n.output_meta[0].numel if len(n.input_meta) > 2 else 0)


@define("linear", "compute", aten=("aten.linear",), flops=_linear_flops, dtypes=FLOATS)
def linear(input, weight, bias=None):
    out = input @ weight.T
    return out + bias if bias is not None else out


@define("matmul", "compute", aten=("aten.matmul", "aten.mm"), flops=_matmul_flops, dtypes=FLOATS)
def matmul(self, other):
    return np.matmul(self, other)


@define("bmm", "compute", aten=("aten.bmm",), flops=_matmul_flops, dtypes=FLOATS)
def bmm(self, mat2):
    return np.matmul(self, mat2)


@define("addmm", "compute", aten=("aten.addmm",), flops=lambda n: 2 * n.output_meta[0].numel * n.input_meta[1].shape[-1],
        dtypes=FLOATS)
def addmm(self, mat1, mat2, beta=1, alpha=1):
    prod = mat1 @ mat2
    return beta * self + alpha * prod if (beta != 1 or alpha != 1) else self + prod


@define("baddbmm", "compute", aten=("aten.baddbmm",), flops=lambda n: 2 * n.output_meta[0].numel * n.input_meta[1].shape[-1],
        dtypes=FLOATS)
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return beta * self + alpha * np.matmul(batch1, batch2)


# --- convolution -------------------------------------------------------------------------
def _tuple(v, n):
    if isinstance(v, (list, tuple)):
        return tuple(v) if len(v) == n else tuple(v) * n
    return (v,) * n


def _conv_flops(n):
    w = n.input_meta[1].shape            # (C_out, C_in/groups, *k)
    per_out = 2 * math.prod(w[1:])
    return n.output_meta[0].numel * per_out


def _convnd(x, w, b, stride, padding, dilation, groups, nd):
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    ks = w.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        else:  # "same": torch pads the extra element on the right
            pads = []
            for k, d in zip(ks, dilation):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))
    else:
        pads = [(p, p) for p in _tuple(padding, nd)]
    x = np.pad(x, [(0, 0), (0, 0)] + pads)
    n_, c = x.shape[:2]
    co = w.shape[0]
    spatial = x.shape[2:]
    out_sz = [(s - d * (k - 1) - 1) // st + 1 for s, k, d, st in zip(spatial, ks, dilation, stride)]
    # im2col through a strided window view: (N, C, *out, *k)
    win = np.lib.stride_tricks.sliding_window_view(
        x, [d * (k - 1) + 1 for k, d in zip(ks, dilation)], axis=tuple(range(2, 2 + nd)))
    sl = (slice(None), slice(None)) + tuple(slice(None, o * st, st) for o, st in zip(out_sz, stride)) + \
        tuple(slice(None, None, d) for d in dilation)
    win = win[sl]
    cg, cog = c // groups, co // groups
    outs = []
    for g in range(groups):
        xg = win[:, g * cg:(g + 1) * cg]                      # N, cg, *out, *k
        wg = w[g * cog:(g + 1) * cog]                         # cog, cg, *k
        xs = np.moveaxis(xg, 1, 1 + nd)                       # N, *out, cg, *k
        cols = xs.reshape(n_, math.prod(out_sz), cg * math.prod(ks))
        outs.append(cols @ wg.reshape(cog, -1).T)             # N, P, cog
    out = np.concatenate(outs, axis=2) if groups > 1 else outs[0]
    out = np.moveaxis(out, 2, 1).reshape(n_, co, *out_sz)
    if b is not None:
        out = out + b.reshape((1, co) + (1,) * nd)
    return np.ascontiguousarray(out.astype(x.dtype, copy=False))


@define("conv1d", "compute", aten=("aten.conv1d",), flops=_conv_flops, dtypes=FLOATS)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 1)


@define("conv2d", "compute", aten=("aten.conv2d",), flops=_conv_flops, dtypes=FLOATS)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 2)


@define("convolution", "compute", aten=("aten.convolution",), flops=_conv_flops, dtypes=FLOATS)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise NotImplementedError("transposed convolution has no numpy kernel yet")
    return _convnd(input, weight, bias, stride, padding, dilation, groups, input.ndim - 2)


# --- pooling -----------------------------------------------------------------------------
def _pool_windows(x, kernel, stride, padding, ceil_mode, fill, dilation=(1, 1)):
    kernel = _tuple(kernel, 2)
    stride = _tuple(stride, 2) if stride not in (None, [], ()) else kernel
    padding, dilation = _tuple(padding, 2), _tuple(dilation, 2)
    h, w = x.shape[-2:]
    outs = []
    for s, k, st, p, d in zip((h, w), kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        o = (s + 2 * p - span + (st - 1 if ceil_mode else 0)) // st + 1
        if ceil_mode and (o - 1) * st >= s + p:
            o -= 1
        outs.append(o)
    extra = [max(0, (o - 1) * st + d * (k - 1) + 1 - s - 2 * p) for o, st, k, s, p, d in
             zip(outs, stride, kernel, (h, w), padding, dilation)]
    pad = [(0, 0)] * (x.ndim - 2) + [(p, p + e) for p, e in zip(padding, extra)]
    xp = np.pad(x, pad, constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, [d * (k - 1) + 1 for k, d in zip(kernel, dilation)], axis=(-2, -1))
    win = win[..., :outs[0] * stride[0]:stride[0], :outs[1] * stride[1]:stride[1], ::dilation[0], ::dilation[1]]
    return win, kernel, padding, stride, (h, w)


@define("max_pool2d", "reduction", aten=("aten.max_pool2d",), flops=lambda n: n.input_meta[0].numel)
def max_pool2d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    win, *_ = _pool_windows(self, kernel_size, stride, padding, ceil_mode, -np.inf, _tuple(dilation, 2))
    return win.max(axis=(-2, -1)).astype(self.dtype)


@define("avg_pool2d", "reduction", aten=("aten.avg_pool2d",), flops=lambda n: n.input_meta[0].numel)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    win, kernel, pad, stride_, (h, w) = _pool_windows(self, kernel_size, stride, padding, ceil_mode, 0.0)
    total = win.sum(axis=(-2, -1))
    if divisor_override:
        return (total / divisor_override).astype(self.dtype)
    ones = np.ones((h, w), dtype=self.dtype)
    if count_include_pad:
        ones = np.pad(ones, [(p, p) for p in pad], constant_values=1.0)
        cwin, *_ = _pool_windows(ones[None], kernel, stride_, 0, ceil_mode, 0.0)
    else:
        cwin, *_ = _pool_windows(ones[None], kernel, stride_, pad, ceil_mode, 0.0)
    count = cwin.sum(axis=(-2, -1))[0][: total.shape[-2], : total.shape[-1]]
    return (total / count).astype(self.dtype)


def _adaptive_bounds(size, out):
    return [(math.floor(i * size / out), math.ceil((i + 1) * size / out)) for i in range(out)]


@define("adaptive_avg_pool2d", "reduction", aten=("aten.adaptive_avg_pool2d",), flops=lambda n: n.input_meta[0].numel)
def adaptive_avg_pool2d(self, output_size):
    oh, ow = _tuple(output_size, 2)
    h, w = self.shape[-2:]
    oh, ow = oh or h, ow or w
    if h % oh == 0 and w % ow == 0:
        r = self.reshape(*self.shape[:-2], oh, h // oh, ow, w // ow)
        return r.mean(axis=(-3, -1)).astype(self.dtype)
    out = np.empty(self.shape[:-2] + (oh, ow), dtype=self.dtype)
    for i, (h0, h1) in enumerate(_adaptive_bounds(h, oh)):
        for j, (w0, w1) in enumerate(_adaptive_bounds(w, ow)):
            out[..., i, j] = self[..., h0:h1, w0:w1].mean(axis=(-2, -1))
    return out


@define("adaptive_avg_pool1d", "reduction", aten=("aten.adaptive_avg_pool1d",), flops=lambda n: n.input_meta[0].numel)
def adaptive_avg_pool1d(self, output_size):
    return adaptive_avg_pool2d(self[..., None, :], (1, _tuple(output_size, 1)[0]))[..., 0, :]


# --- normalization -----------------------------------------------------------------------
def _norm_flops(n):
    return 5 * n.input_meta[0].numel


@define("batch_norm", "normalization", aten=("aten.batch_norm",), flops=_norm_flops, dtypes=FLOATS)
def batch_norm(input, weight, bias, running_mean, running_var, training=False, momentum=0.1, eps=1e-5,
               cudnn_enabled=True):
    shape = (1, -1) + (1,) * (input.ndim - 2)
    if training or running_mean is None:
        axes = (0,) + tuple(range(2, input.ndim))
        mean, var = input.mean(axis=axes), input.var(axis=axes)
    else:
        mean, var = running_mean, running_var
    out = (input - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out.astype(input.dtype, copy=False)


@define("layer_norm", "normalization", aten=("aten.layer_norm",), flops=_norm_flops, dtypes=FLOATS)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = input.astype(np.float64) if input.dtype == np.float16 else input
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    out = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(input.dtype, copy=False)


@define("group_norm", "normalization", aten=("aten.group_norm",), flops=_norm_flops, dtypes=FLOATS)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c = input.shape[:2]
    x = input.reshape(n, num_groups, -1)
    mean = x.mean(axis=2, keepdims=True)
    var = x.var(axis=2, keepdims=True)
    out = ((x - mean) / np.sqrt(var + eps)).reshape(input.shape)
    shape = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out.astype(input.dtype, copy=False)


@define("rms_norm", "normalization", aten=("aten.rms_norm",), flops=_norm_flops, dtypes=FLOATS)
def rms_norm(input, normalized_shape, weight=None, eps=None):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    if eps is None:
        eps = float(np.finfo(input.dtype).eps)
    out = input / np.sqrt((input * input).mean(axis=axes, keepdims=True) + eps)
    if weight is not None:
        out = out * weight
    return out.astype(input.dtype, copy=False)


# --- softmax, attention, embedding -------------------------------------------------------
def _softmax(x, dim):
    m = np.max(x, axis=dim, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    return e / np.sum(e, axis=dim, keepdims=True)


@define("softmax", "normalization", aten=("aten.softmax", "aten._softmax"), flops=lambda n: 5 * n.input_meta[0].numel,
        dtypes=FLOATS)
def softmax(self, dim, dtype=None):
    if dtype is not None and not isinstance(dtype, bool):
        from ..dtypes import to_numpy
        self = self.astype(to_numpy(dtype))
    return _softmax(self, dim).astype(self.dtype, copy=False)


@define("log_softmax", "normalization", aten=("aten.log_softmax", "aten._log_softmax"),
        flops=lambda n: 5 * n.input_meta[0].numel, dtypes=FLOATS)
def log_softmax(self, dim, dtype=None):
    m = np.max(self, axis=dim, keepdims=True)
    s = self - m
    return (s - np.log(np.sum(np.exp(s), axis=dim, keepdims=True))).astype(self.dtype, copy=False)


def _sdpa_flops(n):
    q, k = n.input_meta[0].shape, n.input_meta[1].shape
    L, E = q[-2], q[-1]
    S = k[-2]
    batch = math.prod(q[:-2])
    ev = n.input_meta[2].shape[-1]
    return 2 * batch * L * S * E + 2 * batch * L * S * ev + 5 * batch * L * S


@define("scaled_dot_product_attention", "compute", aten=("aten.scaled_dot_product_attention",), flops=_sdpa_flops,
        dtypes=FLOATS)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    L, S = query.shape[-2], key.shape[-2]
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = np.repeat(key, rep, axis=-3), np.repeat(value, rep, axis=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = np.matmul(query, np.swapaxes(key, -1, -2)) * np.asarray(scale, dtype=query.dtype)
    if is_causal:
        causal = np.tril(np.ones((L, S), dtype=bool))
        scores = np.where(causal, scores, -np.inf)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            scores = np.where(attn_mask, scores, -np.inf)
        else:
            scores = scores + attn_mask
    return np.matmul(_softmax(scores, -1), value).astype(query.dtype, copy=False)


@define("embedding", "copy", aten=("aten.embedding",), flops=lambda n: 0)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]


@define("dropout", "copy", aten=("aten.dropout", "aten.dropout_", "aten.feature_dropout", "aten.alpha_dropout"),
        flops=lambda n: 0)
def dropout(input, p=0.5, train=False):
    if train and p > 0:
        raise NotImplementedError("dropout in training mode is not deterministic; run the model in eval()")
    return input
