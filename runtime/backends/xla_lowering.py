"""The xla backend's lowerings beyond a plain forward: the views, reductions and masks transformers' models use,
the ATen ops of a training graph's backward (GELU's as `jax.vjp` of the forward's own lowering, so the two
cannot disagree), and opscope's optimizer ops -- so a whole training step can be XLA regions.

    lower = more_lowerings(base)           # base: xla_backend's ATen schema name -> jax function table
    lower["aten::gelu_backward"](grad, x, approximate="tanh")

Each entry takes the ATen op's own arguments (device and layout keywords are dropped before the call).
"""
from __future__ import annotations

import math
import operator


def _axes(dim, ndim):
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return None
    return tuple(d % ndim for d in (dim if isinstance(dim, (list, tuple)) else [dim]))


def _slice(x, dim=0, start=None, end=None, step=1):
    return x[(slice(None),) * (dim % x.ndim) + (slice(start, end, step),)]


def _expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    import jax.numpy as jnp
    return jnp.broadcast_to(x, tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)))


def _flatten(x, start_dim=0, end_dim=-1):
    s, e = start_dim % max(x.ndim, 1), end_dim % max(x.ndim, 1)
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:]) if x.ndim else x.reshape(1)


def _pad(x, pad, value=0.0):
    import jax
    widths = [(0, 0, 0)] * (x.ndim - len(pad) // 2) + [(pad[i], pad[i + 1], 0) for i in range(len(pad) - 2, -1, -2)]
    return jax.lax.pad(x, jax.numpy.asarray(value, x.dtype), widths)      # lax.pad: negative widths crop, as torch


def _dropout(x, p, train):
    if train and p:                      # eager's random mask cannot be reproduced: refuse rather than differ
        raise NotImplementedError("dropout in training mode has no xla lowering (its random mask is torch's)")
    return x


def _conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    import jax
    pair = lambda v: tuple(v) * (2 if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v, v)  # noqa: E731
    pad = padding if isinstance(padding, str) else [(p, p) for p in pair(padding)]
    y = jax.lax.conv_general_dilated(x, w, pair(stride), pad.upper() if isinstance(pad, str) else pad,
                                     rhs_dilation=pair(dilation), feature_group_count=groups,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def _layer_norm_stats(x, shape, w=None, b=None, eps=1e-5):
    import jax.numpy as jnp
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / jnp.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    y = y * w if w is not None else y
    return (y + b if b is not None else y), mean, rstd


def _layer_norm_backward(grad, x, shape, mean, rstd, w, b, mask):
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    outer = tuple(range(x.ndim - len(shape)))
    n = math.prod(shape)
    xhat = (x - mean) * rstd
    g = grad * w if w is not None else grad
    gx = rstd / n * (n * g - g.sum(axis=axes, keepdims=True) - xhat * (g * xhat).sum(axis=axes, keepdims=True))
    return (gx if mask[0] else None, (grad * xhat).sum(axis=outer) if w is not None and mask[1] else None,
            grad.sum(axis=outer) if b is not None and mask[2] else None)


def _picked(target, classes, weight, ignore_index, dtype):
    import jax
    import jax.numpy as jnp
    keep = target != ignore_index
    onehot = jax.nn.one_hot(jnp.where(keep, target, 0), classes, dtype=dtype)
    w = keep.astype(dtype) * ((onehot * weight).sum(-1) if weight is not None else 1)
    return onehot, w


def _nll_loss(x, target, weight, reduction, ignore_index):
    onehot, w = _picked(target, x.shape[-1], weight, ignore_index, x.dtype)
    losses, total = -(x * onehot).sum(-1) * w, w.sum()
    total = total * 0 if reduction == 0 else total          # none: torch's kernel leaves total_weight 0
    return (losses if reduction == 0 else losses.sum() / total if reduction == 1 else losses.sum()), total


def _nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    onehot, w = _picked(target, x.shape[-1], weight, ignore_index, x.dtype)
    g = grad / total_weight if reduction == 1 else grad
    return -onehot * (w * g)[..., None]


def _embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    import jax.numpy as jnp
    flat, g = indices.reshape(-1), grad.reshape(-1, grad.shape[-1])
    g = jnp.where((flat != padding_idx)[:, None], g, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / jnp.maximum(counts[flat], 1)[:, None]
    return jnp.zeros((num_weights, g.shape[-1]), g.dtype).at[flat].add(g)


def _adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    import jax.numpy as jnp
    t = step.astype(param.dtype)            # traced: one program serves every step
    p = param * (1 - lr * weight_decay)
    m = exp_avg + (grad - exp_avg) * (1 - beta1)
    v = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    denom = jnp.sqrt(v) / jnp.sqrt(1 - beta2 ** t) + eps
    return [p - m / denom * (lr / (1 - beta1 ** t)), m, v]


def more_lowerings(base: dict) -> dict:
    """`base` plus the lowerings above; GELU's backward is jax.vjp of base's own forward."""
    import jax
    import jax.numpy as jnp

    from ..ops.optim import sgd

    gelu = base["aten::gelu"]

    def scores(q, k, is_causal, attn_mask, scale):
        """Grouped kv heads repeated to the query's; scaled, masked q.k (what both directions start from)."""
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        s = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * scale
        if is_causal:
            s = jnp.where(jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), dtype=bool)), s, -jnp.inf)
        if attn_mask is not None:
            s = jnp.where(attn_mask, s, -jnp.inf) if attn_mask.dtype == bool else s + attn_mask
        return s

    def flash(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
        s = scores(q, k, is_causal, attn_mask, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
        lse = jax.nn.logsumexp(s, axis=-1)
        return jnp.matmul(jnp.exp(s - lse[..., None]), jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)), lse

    def flash_backward(grad, q, k, v, out, lse, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
        # NOTE: from the op's own out and logsumexp, as ATen's kernel, not recomputed: its contract is its inputs
        sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        rep = q.shape[-3] // k.shape[-3]
        p = jnp.exp(scores(q, k, is_causal, attn_mask, sc) - lse[..., None])
        dv = jnp.matmul(jnp.swapaxes(p, -1, -2), grad)
        dp = jnp.matmul(grad, jnp.swapaxes(jnp.repeat(v, rep, axis=-3), -1, -2))
        ds = p * (dp - (grad * out).sum(-1, keepdims=True)) * sc
        dk = jnp.matmul(jnp.swapaxes(ds, -1, -2), q)
        per_kv = lambda t: t.reshape(*t.shape[:-3], -1, rep, *t.shape[-2:]).sum(-3)  # noqa: E731
        return jnp.matmul(ds, jnp.repeat(k, rep, axis=-3)), per_kv(dk), per_kv(dv)

    def gelu_backward(grad, x, approximate="none"):
        return jax.vjp(lambda x: gelu(x, approximate), x)[1](grad)[0]

    same = lambda x, *_, **__: x  # noqa: E731
    compare = {f"aten::{n}": getattr(operator, n) for n in ("ge", "gt", "le", "lt", "eq", "ne")}
    return {**base, **compare,
            "aten::detach": same, "aten::alias": same, "aten::clone": same, "aten::contiguous": same,
            "aten::lift_fresh_copy": same, "aten::dropout": _dropout,
            "aten::_unsafe_view": lambda x, shape: jnp.reshape(x, shape),
            "aten::sum": lambda x, dim=None, keepdim=False, dtype=None: x.sum(axis=_axes(dim, x.ndim), keepdims=keepdim),
            "aten::slice": _slice, "aten::select": lambda x, dim, index: jnp.take(x, index, axis=dim),
            "aten::unsqueeze": lambda x, dim: jnp.expand_dims(x, dim % (x.ndim + 1)),
            "aten::squeeze": lambda x, dim=None: jnp.squeeze(x, _axes(dim, x.ndim)),
            "aten::expand": _expand, "aten::flatten": _flatten,
            "aten::cat": lambda xs, dim=0: jnp.concatenate(xs, axis=dim),
            "aten::gather": lambda x, dim, index, sparse_grad=False: jnp.take_along_axis(x, index, axis=dim),
            "aten::conv2d": _conv2d, "aten::rsqrt": jax.lax.rsqrt, "aten::neg": jnp.negative, "aten::sqrt": jnp.sqrt,
            "aten::pow": lambda x, e: x ** e, "aten::erf": jax.scipy.special.erf,
            "aten::where": jnp.where, "aten::masked_fill": lambda x, mask, v: jnp.where(mask, v, x),
            "aten::index": lambda x, indices: x[tuple(slice(None) if i is None else i for i in indices)],
            "aten::bitwise_and": jnp.bitwise_and, "aten::bitwise_or": jnp.bitwise_or,
            "aten::bitwise_not": jnp.bitwise_not, "aten::constant_pad_nd": _pad,
            # dtype= is dropped before the call: the program casts each output to the dtype capture recorded
            "aten::scalar_tensor": lambda v, **_: jnp.asarray(v), "aten::new_ones": lambda x, size, **_: jnp.ones(size),
            "aten::ones_like": lambda x, **_: jnp.ones_like(x), "aten::zeros_like": lambda x, **_: jnp.zeros_like(x),
            "aten::native_layer_norm": _layer_norm_stats, "aten::native_layer_norm_backward": _layer_norm_backward,
            "aten::_scaled_dot_product_flash_attention_for_cpu": flash,
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward": flash_backward,
            "aten::gelu_backward": gelu_backward,
            "aten::tanh_backward": lambda grad, out: grad * (1 - out * out),
            "aten::threshold_backward": lambda grad, x, threshold: jnp.where(x <= threshold, 0, grad),
            "aten::_log_softmax": lambda x, dim, half_to_float=False: jax.nn.log_softmax(x, axis=dim),
            "aten::_log_softmax_backward_data": lambda grad, out, dim, dtype: grad - jnp.exp(out) * grad.sum(
                axis=dim, keepdims=True),
            "aten::nll_loss_forward": _nll_loss, "aten::nll_loss_backward": _nll_loss_backward,
            "aten::embedding_dense_backward": _embedding_backward,
            "opscope::sgd": sgd, "opscope::adamw": _adamw}
