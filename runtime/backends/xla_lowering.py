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


def _squeeze(x, dim=None):
    """ATen's squeeze: a named dim whose size is not 1 stays (jnp.squeeze refuses it; the value check found it)."""
    import jax.numpy as jnp
    if dim is None or x.ndim == 0:
        return jnp.squeeze(x)
    return jnp.squeeze(x, tuple(d for d in _axes(dim, x.ndim) if x.shape[d] == 1))


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


def _conv(x, w, b, stride, padding, dilation, groups, lhs_dilation=None):
    """N-d convolution in torch's layout (NC..., OI...); padding a number per dim, pairs, or 'same'/'valid'."""
    import jax
    nd = x.ndim - 2
    tup = lambda v: tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd  # noqa: E731
    if isinstance(padding, str):
        pad = padding.upper()
    else:
        pad = [p if isinstance(p, tuple) else (p, p) for p in (padding if isinstance(padding, list) and padding
                                                              and isinstance(padding[0], tuple) else tup(padding))]
    dims = ("NCH", "OIH", "NCH") if nd == 1 else ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW")
    y = jax.lax.conv_general_dilated(x, w, tup(stride), pad, lhs_dilation=lhs_dilation, rhs_dilation=tup(dilation),
                                     feature_group_count=groups, dimension_numbers=dims)
    return y if b is None else y + b.reshape((1, -1) + (1,) * nd)


def _conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch's transposed convolution as the gradient of a convolution: the input dilated by the stride, the
    kernel flipped with in and out swapped (per group), padded dilation*(k-1)-padding, output_padding on the end."""
    import jax.numpy as jnp
    nd = x.ndim - 2
    tup = lambda v: tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd  # noqa: E731
    k = w.shape[2:]
    cin, cout_g = w.shape[0], w.shape[1]
    wg = w.reshape((groups, cin // groups, cout_g) + k)
    wg = jnp.swapaxes(wg, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    wg = jnp.flip(wg, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, op, d in zip(k, tup(padding), tup(output_padding), tup(dilation))]
    return _conv(x, wg, b, 1, pads, dilation, groups, lhs_dilation=tup(stride))


def _batch_norm(x, weight, bias, mean, var, training, momentum, eps, cudnn_enabled=False):
    import jax.numpy as jnp
    if training:              # batch statistics and running-stat updates: eager's, on the fallback
        raise NotImplementedError("batch_norm in training mode has no xla lowering (it updates running statistics)")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps)
    y = y * weight.reshape(shape) if weight is not None else y
    return y + bias.reshape(shape) if bias is not None else y


def _max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    import jax
    import jax.numpy as jnp
    nd = len(kernel_size)
    tup = lambda v: tuple(v) * (nd if len(tuple(v)) == 1 else 1) if isinstance(v, (list, tuple)) else (v,) * nd  # noqa: E731
    if ceil_mode:
        raise NotImplementedError("max_pool with ceil_mode has no xla lowering")
    k, st = tup(kernel_size), tup(stride) if stride else tup(kernel_size)
    init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return jax.lax.reduce_window(x, jnp.asarray(init, x.dtype), jax.lax.max, (1, 1) + k, (1, 1) + st,
                                 [(0, 0), (0, 0)] + [(p, p) for p in tup(padding)], window_dilation=(1, 1) + tup(dilation))


def _source(n_in, n_out, scale, align_corners, nearest=False):
    """Source coordinate of each output position along one axis, as ATen's upsample kernels compute it."""
    import jax.numpy as jnp
    i = jnp.arange(n_out, dtype=jnp.float32)
    if nearest:
        s = (1.0 / scale) if scale else n_in / n_out
        return jnp.minimum(jnp.floor(i * s).astype(jnp.int32), n_in - 1)
    if align_corners:
        return i * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    s = (1.0 / scale) if scale else n_in / n_out
    return jnp.maximum((i + 0.5) * s - 0.5, 0.0)


def _out_size(x, output_size, scale_factors):
    nd = x.ndim - 2
    if output_size:
        return list(output_size), [None] * nd
    return [int(math.floor(d * f)) for d, f in zip(x.shape[2:], scale_factors)], list(scale_factors)


def _upsample_linear(x, output_size, align_corners, scale_factors=None):
    import jax.numpy as jnp
    sizes, scales = _out_size(x, output_size, scale_factors)
    for axis, (n_out, sc) in enumerate(zip(sizes, scales), start=2):
        n_in = x.shape[axis]
        src = _source(n_in, n_out, sc, align_corners)
        lo = jnp.minimum(jnp.floor(src).astype(jnp.int32), n_in - 1)
        hi = jnp.minimum(lo + 1, n_in - 1)
        t = (src - lo).astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1 - axis))
        x = jnp.take(x, lo, axis=axis) * (1 - t) + jnp.take(x, hi, axis=axis) * t
    return x


def _upsample_nearest(x, output_size, scale_factors=None):
    import jax.numpy as jnp
    sizes, scales = _out_size(x, output_size, scale_factors)
    for axis, (n_out, sc) in enumerate(zip(sizes, scales), start=2):
        x = jnp.take(x, _source(x.shape[axis], n_out, sc, False, nearest=True), axis=axis)
    return x


def _pad_mode(x, pad, mode="constant", value=None):
    import jax.numpy as jnp
    if mode == "constant":
        return _pad(x, pad, 0.0 if value is None else value)
    widths = [(0, 0)] * (x.ndim - len(pad) // 2) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
    return jnp.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


def _topk(x, k, dim=-1, largest=True, sorted=True):
    import jax
    import jax.numpy as jnp
    moved = jnp.moveaxis(x, dim, -1)
    v, i = jax.lax.top_k(moved if largest else -moved, k)
    return jnp.moveaxis(v if largest else -v, -1, dim), jnp.moveaxis(i, -1, dim)


def _sort(x, dim=-1, descending=False, stable=False):
    import jax.numpy as jnp
    i = jnp.argsort(x, axis=dim, descending=descending, stable=True)
    return jnp.take_along_axis(x, i, axis=dim), i


def _min_max(pick, arg):
    def op(x, *a, **k):
        import jax.numpy as jnp
        if not a and not k:                                   # the whole tensor
            return pick(x)
        other = a[0] if a else k.get("other", k.get("dim"))
        if hasattr(other, "shape"):                           # elementwise, against another tensor
            return (jnp.minimum if pick is jnp.min else jnp.maximum)(x, other)
        keep = (a[1] if len(a) > 1 else k.get("keepdim", False))
        return pick(x, axis=other, keepdims=keep), arg(x, axis=other, keepdims=keep)
    return op


def _histc(x, bins=100, min=0, max=0):      # noqa: A002 - ATen's argument names
    import jax.numpy as jnp
    lo, hi = (x.min(), x.max()) if min == max else (jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype))
    flat = x.reshape(-1)
    idx = jnp.floor((flat - lo) / (hi - lo) * bins).astype(jnp.int32)
    idx = jnp.where(flat == hi, bins - 1, idx)
    keep = (flat >= lo) & (flat <= hi)
    return jnp.zeros((bins,), x.dtype).at[jnp.where(keep, idx, 0)].add(keep.astype(x.dtype))


def _group_norm(x, groups, w=None, b=None, eps=1e-5, cudnn_enabled=True):
    import jax.numpy as jnp
    g = x.reshape(x.shape[0], groups, -1)
    mean = g.mean(-1, keepdims=True)
    y = ((g - mean) / jnp.sqrt(((g - mean) ** 2).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    y = y * w.reshape(per_channel) if w is not None else y
    return y + b.reshape(per_channel) if b is not None else y


def _weight_norm(v, g, dim=0):
    import jax.numpy as jnp
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim) if dim is not None and dim != -1 else None
    return v * (g / jnp.sqrt((v * v).sum(axis=axes, keepdims=True)))


def _grouped_mm(x, w, offs):
    """transformers' MoE grouped matmul: row r (sorted by expert) times the weight of its expert, the number of
    offs at or below r; rows past offs[-1] stay 0, as in its kernel."""
    import jax.numpy as jnp
    expert = (jnp.arange(x.shape[0])[:, None] >= offs[None, :]).sum(1)
    pick = (expert[None, :] == jnp.arange(w.shape[0])[:, None]).astype(x.dtype)
    return (jnp.matmul(x, w) * pick[..., None]).sum(0)


def _adaptive_avg_pool1d(x, output_size):
    """torch's bins: output i averages [floor(i * L / n), ceil((i + 1) * L / n))."""
    import jax.numpy as jnp
    n, length = output_size[0], x.shape[-1]
    return jnp.stack([x[..., (i * length) // n:-((-(i + 1) * length) // n)].mean(-1) for i in range(n)], -1)


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _conv_transpose(x, w, b, stride, padding, output_padding, groups, dilation)
    return _conv(x, w, b, stride, padding, dilation, groups)


def _convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                          mask):
    """(grad input, grad weight, grad bias) as jax.vjp of the forward's own lowering: the two cannot disagree."""
    import jax
    _, vjp = jax.vjp(lambda x, w: _convolution(x, w, None, stride, padding, dilation, transposed, output_padding,
                                               groups), x, w)
    gx, gw = vjp(grad)
    gb = grad.sum(axis=(0,) + tuple(range(2, grad.ndim))) if bias_sizes is not None and mask[2] else None
    return gx if mask[0] else None, gw if mask[1] else None, gb


def _native_group_norm(x, w, b, n, c, hxw, group, eps):
    import jax.numpy as jnp
    g = x.reshape(n, group, -1)
    mean = g.mean(-1)
    rstd = 1.0 / jnp.sqrt(((g - mean[..., None]) ** 2).mean(-1) + eps)
    return _group_norm(x, group, w, b, eps), mean, rstd


def _native_group_norm_backward(grad, x, mean, rstd, w, n, c, hxw, group, mask):
    """From the saved statistics, as ATen's kernel: per group, rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    xhat = (x.reshape(n, group, -1) - mean[..., None]) * rstd[..., None]
    g = (grad * w.reshape(per_channel) if w is not None else grad).reshape(n, group, -1)
    gx = rstd[..., None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    spatial = (0,) + tuple(range(2, x.ndim))
    gw = (grad * xhat.reshape(x.shape)).sum(axis=spatial) if w is not None and mask[1] else None
    return gx.reshape(x.shape) if mask[0] else None, gw, grad.sum(axis=spatial) if mask[2] else None


def _weight_norm_interface(v, g, dim=0):
    import jax.numpy as jnp
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
    norms = jnp.sqrt((v * v).sum(axis=axes, keepdims=True))
    return v * (g / norms), norms.reshape(g.shape)


def _weight_norm_interface_backward(grad_w, v, g, norms, dim=0):
    """From the forward's saved norms, as ATen's kernel (a vjp of the forward recomputed them from v: off ATen
    wherever the saved ones differ, which the region check's independent samples showed)."""
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
    norms = norms.reshape([1 if a in axes else v.shape[a] for a in range(v.ndim)])
    grad_g = (grad_w * v).sum(axis=axes, keepdims=True) / norms
    grad_v = g.reshape(norms.shape) / norms * (grad_w - v * grad_g / norms)
    return grad_v, grad_g.reshape(g.shape)


def _index_of(view_args, ndim, shape):
    """The index a select (dim, index) or slice (dim, start, end, step) view takes, for .at[...]."""
    dim, *rest = view_args
    dim %= ndim
    if len(rest) == 1:
        return (slice(None),) * dim + (rest[0],)
    start, end, step = (list(rest) + [None, None, 1])[:3]
    return (slice(None),) * dim + (slice(*slice(start, end, step).indices(shape[dim])),)


def scatter_into(x, src, *view_args):
    """x with src written where the select (dim, index) or slice (dim, start, end, step) view takes its elements."""
    return x.at[_index_of(view_args, x.ndim, x.shape)].set(src)


def _view_backward(grad, input_sizes, *view_args):
    import jax.numpy as jnp
    return scatter_into(jnp.zeros(tuple(input_sizes), grad.dtype), grad, *view_args)


def _safe_softmax(x, dim, dtype=None):
    """softmax, 0 where a row is all -inf (a fully masked query) instead of NaN."""
    import jax
    import jax.numpy as jnp
    return jnp.where(jnp.all(x == -jnp.inf, axis=dim, keepdims=True), 0.0, jax.nn.softmax(x, axis=dim))


def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return scatter_into(x, src, dim, start, end, step)


def _chunk(x, chunks, dim=0):
    import jax.numpy as jnp
    size = -(-x.shape[dim] // chunks)
    return jnp.split(x, list(range(size, x.shape[dim], size)), axis=dim)


def _index_put(x, indices, values, accumulate=False):
    at = x.at[tuple(slice(None) if i is None else i for i in indices)]
    return at.add(values) if accumulate else at.set(values)


def _lstm(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten::lstm.input: a scan per layer and direction, gates in torch's order (input, forget, cell, output)."""
    import jax
    import jax.numpy as jnp
    if train and dropout:
        raise NotImplementedError("lstm with dropout in training has no xla lowering")
    h0, c0 = hx
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    seq = jnp.swapaxes(x, 0, 1) if batch_first else x           # (time, batch, features)
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = (layer * dirs + d) * per
            w_ih, w_hh = params[k], params[k + 1]
            b = params[k + 2] + params[k + 3] if has_biases else 0

            def cell(carry, xt, w_ih=w_ih, w_hh=w_hh, b=b):
                h, c = carry
                i, f, g, o = jnp.split(xt @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h
            (h, c), y = jax.lax.scan(cell, (h0[layer * dirs + d], c0[layer * dirs + d]), seq, reverse=d == 1)
            outs.append(y)
            hs.append(h)
            cs.append(c)
        seq = jnp.concatenate(outs, axis=-1) if dirs == 2 else outs[0]
    out = jnp.swapaxes(seq, 0, 1) if batch_first else seq
    return out, jnp.stack(hs), jnp.stack(cs)


# ops a region may run in place: the program rebinds the value they mutate (xla_backend.XlaProgram)
IN_PLACE = {"aten::relu_": "aten::relu", "aten::add_": "aten::add", "aten::sub_": "aten::sub",
            "aten::mul_": "aten::mul", "aten::div_": "aten::div", "aten::index_put_": "aten::index_put",
            "aten::fill_": "aten::fill", "aten::copy_": "aten::copy"}


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
    table = _table(base, compare, same, gelu, flash, flash_backward, gelu_backward, sgd, jax, jnp)
    return table | {k: table[v] for k, v in IN_PLACE.items()}


def _table(base, compare, same, gelu, flash, flash_backward, gelu_backward, sgd, jax, jnp):
    return {**base, **compare,
            "aten::detach": same, "aten::alias": same, "aten::clone": same, "aten::contiguous": same,
            "aten::lift_fresh_copy": same, "aten::dropout": _dropout,
            "aten::_unsafe_view": lambda x, shape: jnp.reshape(x, shape),
            "aten::sum": lambda x, dim=None, keepdim=False, dtype=None: x.sum(axis=_axes(dim, x.ndim), keepdims=keepdim),
            "aten::slice": _slice, "aten::select": lambda x, dim, index: jnp.take(x, index, axis=dim),
            "aten::unsqueeze": lambda x, dim: jnp.expand_dims(x, dim % (x.ndim + 1)),
            "aten::squeeze": _squeeze,
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
            "opscope::sgd": sgd, "opscope::adamw": _adamw,
            # casts: the program casts each output to the dtype capture recorded (dtype= is dropped before the call)
            "aten::to": lambda x, *_, **__: x, "aten::_to_copy": lambda x, *_, **__: x,
            "aten::sin": jnp.sin, "aten::cos": jnp.cos, "aten::abs": jnp.abs, "aten::log": jnp.log,
            "aten::cumsum": lambda x, dim, **_: jnp.cumsum(x, axis=dim),
            "aten::diff": lambda x, n=1, dim=-1, prepend=None, append=None: jnp.diff(x, n, axis=dim, prepend=prepend,
                                                                                   append=append),
            "aten::__and__": jnp.bitwise_and, "aten::__or__": jnp.bitwise_or,
            "aten::logical_and": jnp.logical_and, "aten::logical_or": jnp.logical_or,
            "aten::floor_divide": jnp.floor_divide, "aten::relu": jax.nn.relu,
            "aten::log_softmax": lambda x, dim, **_: jax.nn.log_softmax(x, axis=dim),
            "aten::zeros": lambda size, **_: jnp.zeros(size), "aten::ones": lambda size, **_: jnp.ones(size),
            "aten::full_like": lambda x, v, **_: jnp.full_like(x, v), "aten::empty_like": lambda x, **_: jnp.zeros_like(x),
            "aten::min": _min_max(jnp.min, jnp.argmin), "aten::max": _min_max(jnp.max, jnp.argmax),
            "aten::conv1d": lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1: _conv(
                x, w, b, stride, padding, dilation, groups),
            "aten::conv_transpose2d": _conv_transpose, "aten::conv_transpose1d": _conv_transpose,
            "aten::batch_norm": _batch_norm, "aten::max_pool2d": _max_pool,
            "aten::upsample_bilinear2d": _upsample_linear, "aten::upsample_nearest2d": _upsample_nearest,
            "aten::pad": _pad_mode,
            "aten::roll": lambda x, shifts, dims=(): jnp.roll(x, shifts, axis=tuple(dims) if dims else None),
            "aten::topk": _topk, "aten::sort": _sort, "aten::histc": _histc, "aten::chunk": _chunk,
            "aten::index_put": _index_put, "aten::lstm": _lstm,
            "aten::type_as": lambda x, other: x.astype(other.dtype), "aten::group_norm": _group_norm,
            "aten::_weight_norm": _weight_norm,
            # the backward ops of Llama's rotary halves, ViT's CLS token, T5's buckets, Wav2Vec2's convolutions
            "aten::slice_backward": _view_backward, "aten::select_backward": _view_backward,   # every argument given
            "aten::select_scatter": scatter_into,
            "aten::slice_scatter": _slice_scatter,
            "aten::minimum": jnp.minimum, "aten::maximum": jnp.maximum,
            "aten::new_zeros": lambda x, size, **_: jnp.zeros(size, x.dtype),
            "aten::_safe_softmax": _safe_softmax,
            "aten::_softmax_backward_data": lambda grad, out, dim, dtype=None: out * (grad - (grad * out).sum(
                axis=dim, keepdims=True)),
            "aten::convolution": _convolution, "aten::convolution_backward": _convolution_backward,
            "aten::native_group_norm": _native_group_norm,
            "aten::native_group_norm_backward": _native_group_norm_backward,
            "aten::_weight_norm_interface": _weight_norm_interface,
            "aten::_weight_norm_interface_backward": _weight_norm_interface_backward,
            "aten::fill": lambda x, v: jnp.full_like(x, v),
            "aten::copy": lambda x, src, non_blocking=False: jnp.broadcast_to(src, x.shape).astype(x.dtype),
            "aten::adaptive_avg_pool1d": _adaptive_avg_pool1d, "transformers::grouped_mm_fallback": _grouped_mm}
