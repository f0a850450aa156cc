"""Neural-network ops (linear algebra, normalization, attention, embedding, softmax, dropout):
numpy reference kernels and their cost models. Convolution and pooling live in their own modules."""
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
    weights = _softmax(scores, -1)
    if dropout_p > 0:               # sdpa applies dropout whenever dropout_p > 0, whatever the module's mode
        weights = weights * _keep(weights.shape, dropout_p) / (1 - dropout_p)
    return np.matmul(weights, value).astype(query.dtype, copy=False)


@define("embedding", "copy", aten=("aten.embedding",), flops=lambda n: 0)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]


@define("embedding_bag", "reduction", aten=("aten._embedding_bag", "aten._embedding_bag_forward_only"),
        flops=lambda n: n.input_meta[1].numel * n.input_meta[0].shape[-1])
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """(output, offset2bag, bag_size, max_indices): sum (0), mean (1) or max (2) of each bag's rows.

    The three extra outputs are ATen's bookkeeping for the backward, reproduced as the CPU kernel
    returns them (its float32 sum fast path leaves offset2bag empty; bag_size is zero in sum mode)."""
    n, d = len(indices), weight.shape[1]
    bounds = list(offsets) + ([] if include_last_offset else [n])
    bags = len(bounds) - 1
    out = np.zeros((bags, d), dtype=weight.dtype)
    bag_of = np.zeros(n, dtype=np.int64)
    size = np.zeros(bags, dtype=np.int64)
    argmax = np.zeros((bags, d) if mode == 2 else (bags,), dtype=np.int64)
    for b in range(bags):
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        bag_of[lo:hi] = b
        idx = indices[lo:hi]
        keep = idx != padding_idx if padding_idx is not None and padding_idx >= 0 else np.ones(len(idx), bool)
        rows = weight[idx[keep]].astype(np.float64)
        if per_sample_weights is not None:
            rows = rows * per_sample_weights[lo:hi][keep][:, None]
        size[b] = int(keep.sum())
        if not len(rows):
            continue
        if mode == 2:
            pick = rows.argmax(axis=0)
            out[b], argmax[b] = rows[pick, np.arange(d)], idx[keep][pick]
        else:
            out[b] = rows.sum(axis=0) / (len(rows) if mode == 1 else 1)
    if mode == 0:
        fast = weight.dtype == np.float32 and per_sample_weights is None
        return out, np.zeros(0, np.int64) if fast else bag_of, np.zeros(bags, np.int64), np.zeros(bags, np.int64)
    return out, bag_of, size, (argmax if mode == 2 else size.copy())


_RNG = np.random.default_rng()


def _keep(shape, p):
    return _RNG.random(shape) >= p


@define("dropout", "copy", aten=("aten.dropout", "aten.dropout_"), flops=lambda n: 0)
def dropout(input, p=0.5, train=False):
    """Zero each element with probability p and scale the rest by 1/(1-p) (training); identity in eval."""
    if not train or p == 0:
        return input
    if p >= 1:
        return np.zeros_like(input)
    return (input * _keep(input.shape, p) / (1 - p)).astype(input.dtype)


@define("feature_dropout", "copy", aten=("aten.feature_dropout", "aten.feature_dropout_"), flops=lambda n: 0)
def feature_dropout(input, p=0.5, train=False):
    """Dropout of whole channels (dropout2d/3d): one draw per (batch, channel)."""
    if not train or p == 0:
        return input
    mask = _keep(input.shape[:2] + (1,) * (input.ndim - 2), p) if p < 1 else np.zeros(input.shape[:2], bool)
    return (input * mask / max(1 - p, 1e-30)).astype(input.dtype) if p < 1 else np.zeros_like(input)


def _alpha(input, p, mask):
    alpha = 1.7580993408473766                  # SELU's -scale*alpha: keeps mean and variance (ATen's constant)
    a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
    return (input * mask * a + (mask - 1.0) * alpha * a + alpha * a * p).astype(input.dtype)


@define("alpha_dropout", "copy", aten=("aten.alpha_dropout", "aten.alpha_dropout_"), flops=lambda n: 0)
def alpha_dropout(input, p=0.5, train=False):
    if not train or p == 0:
        return input
    if p >= 1:
        return np.zeros_like(input)
    return _alpha(input, p, _keep(input.shape, p))


@define("feature_alpha_dropout", "copy", aten=("aten.feature_alpha_dropout", "aten.feature_alpha_dropout_"),
        flops=lambda n: 0)
def feature_alpha_dropout(input, p=0.5, train=False):
    if not train or p == 0:
        return input
    if p >= 1:
        return np.zeros_like(input)
    return _alpha(input, p, _keep(input.shape[:2] + (1,) * (input.ndim - 2), p))


# --- normalization variants that return their statistics (what decompositions and training use) ---
# native_layer_norm and native_dropout live with the training ops (backward.py), beside their backwards.
@define("native_group_norm", "normalization", aten=("aten.native_group_norm",), flops=_norm_flops, dtypes=FLOATS)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """(output, mean (N, G), rstd (N, G))."""
    x = input.astype(np.float64).reshape(N, group, -1)
    mean = x.mean(axis=2, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(axis=2, keepdims=True) + eps)
    out = ((x - mean) * rstd).reshape(input.shape)
    shape = (1, C) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out.astype(input.dtype), mean[..., 0].astype(input.dtype), rstd[..., 0].astype(input.dtype)


def _bn(input, weight, bias, running_mean, running_var, training, momentum, eps):
    axes = (0,) + tuple(range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    x = input.astype(np.float64)
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        if running_mean is not None:        # ATen updates the running statistics in place
            n = x.size / x.shape[1]
            running_mean[...] = (1 - momentum) * running_mean + momentum * mean
            running_var[...] = (1 - momentum) * running_var + momentum * var * n / max(n - 1, 1)
    else:
        mean, var = running_mean.astype(np.float64), running_var.astype(np.float64)
    rstd = 1.0 / np.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    saved = (mean, rstd) if training else (np.zeros(0), np.zeros(0))
    return out.astype(input.dtype), saved[0].astype(input.dtype), saved[1].astype(input.dtype)


@define("native_batch_norm_legit", "normalization", aten=("aten._native_batch_norm_legit", "aten.native_batch_norm"),
        flops=_norm_flops, dtypes=FLOATS)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training=None, momentum=0.1, eps=1e-5):
    """(output, save_mean, save_rstd); the .no_stats overload has no running statistics."""
    if isinstance(running_mean, bool):      # .no_stats(input, weight, bias, training, momentum, eps)
        training, momentum, eps = running_mean, running_var, training
        running_mean = running_var = None
    return _bn(input, weight, bias, running_mean, running_var, training, momentum, eps)


@define("native_batch_norm_no_training", "normalization", aten=("aten._native_batch_norm_legit_no_training",),
        flops=_norm_flops, dtypes=FLOATS)
def native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _bn(input, weight, bias, running_mean, running_var, False, momentum, eps)


def _norm_except(v, dim):
    if dim == -1:
        return np.sqrt(np.sum(v.astype(np.float64) ** 2))
    dim = dim % v.ndim
    axes = tuple(a for a in range(v.ndim) if a != dim)
    return np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=axes, keepdims=True))


@define("weight_norm", "normalization", aten=("aten._weight_norm",), flops=lambda n: 3 * n.input_meta[0].numel,
        dtypes=FLOATS)
def weight_norm(v, g, dim=0):
    """w = g * v / ||v|| (the norm over every dim but `dim`): nn.utils.weight_norm."""
    return (v * (g / _norm_except(v, dim))).astype(v.dtype)


@define("weight_norm_interface", "normalization", aten=("aten._weight_norm_interface",),
        flops=lambda n: 3 * n.input_meta[0].numel, dtypes=FLOATS)
def weight_norm_interface(v, g, dim=0):
    """(w, norms): the fused kernel _weight_norm calls; norms has g's shape."""
    norm = _norm_except(v, dim)
    return (v * (g / norm)).astype(v.dtype), norm.reshape(g.shape).astype(g.dtype)


# --- distances ---------------------------------------------------------------------------
def _pnorm(d, p, axis):
    a = np.abs(d.astype(np.float64))
    if p == 0:
        return np.sum(a != 0, axis=axis).astype(np.float64)
    if p == math.inf:
        return np.max(a, axis=axis) if a.shape[axis] else np.zeros(np.delete(a.shape, axis % a.ndim))
    return np.sum(a ** p, axis=axis) ** (1.0 / p)


@define("cdist", "compute", aten=("aten._cdist_forward", "aten.cdist"), dtypes=FLOATS,
        flops=lambda n: 3 * n.output_meta[0].numel * n.input_meta[0].shape[-1])
def cdist(x1, x2, p=2.0, compute_mode=None):
    """Pairwise p-norm distances between the rows of x1 (.., P, M) and x2 (.., R, M)."""
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p, -1).astype(x1.dtype)


@define("pdist", "compute", aten=("aten._pdist_forward", "aten.pdist"), dtypes=FLOATS,
        flops=lambda n: 3 * n.output_meta[0].numel * n.input_meta[0].shape[-1])
def pdist(self, p=2.0):
    """Condensed distances between every pair of rows i < j."""
    i, j = np.triu_indices(self.shape[0], 1)
    return _pnorm(self[i] - self[j], p, -1).astype(self.dtype)
