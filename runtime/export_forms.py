"""Torch forms of the ATen ops that exporters lack: what a region's module runs instead, so the stack gets them.

    from opscope.runtime.export_forms import FORMS
    FORMS[torch.ops.aten.gelu_backward.default](grad, x, approximate="tanh")   # plain tensor ops, traceable

Torch's TorchScript ONNX exporter and OpenVINO's importer both trace a region's module (regions.to_torch) and
convert the ATen ops they meet. A training graph is full of ops neither has a rule for -- the layer-norm, GELU,
log-softmax, NLL-loss, tanh and embedding backwards, `native_layer_norm` and the CPU flash attention's forward -- which
left the whole backward on the fallback. Each form here computes the same values from ops both convert
(matmul, sum, exp, where, comparisons), so those nodes stay in the stack's region.
NOTE: torch._decomp's decompositions are not used as they are: several test tensor conditions in Python
(`torch._check(cond)`), which a trace cannot answer, or end in ops no exporter has
(`_unsafe_masked_index_put_accumulate`). The CPU flash attention's backward has no form: it stays on the fallback.
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _norm_dims(x, shape):
    return list(range(x.dim() - len(shape), x.dim())), list(range(x.dim() - len(shape)))


def native_layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
    dims, _ = _norm_dims(x, shape)
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    rstd = torch.rsqrt((centred * centred).mean(dims, keepdim=True) + eps)
    y = centred * rstd
    y = y * weight if weight is not None else y
    return (y + bias if bias is not None else y), mean, rstd


def native_layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask):
    dims, outer = _norm_dims(x, shape)
    n = math.prod(shape)
    xhat = (x - mean) * rstd
    g = grad * weight if weight is not None else grad
    gx = rstd / n * (n * g - g.sum(dims, keepdim=True) - xhat * (g * xhat).sum(dims, keepdim=True))
    gw = (grad * xhat).sum(outer) if weight is not None and mask[1] else None
    gb = grad.sum(outer) if bias is not None and mask[2] else None
    return gx if mask[0] else None, gw, gb


def log_softmax(x, dim, half_to_float=False):
    return x - torch.logsumexp(x, dim, keepdim=True)


def log_softmax_backward(grad, output, dim, input_dtype):
    return grad - torch.exp(output) * grad.sum(dim, keepdim=True)


def _picked(target, classes, weight, ignore_index, dtype):
    """(one-hot of the targets, each target's weight: 0 where ignored)."""
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    onehot = (safe.unsqueeze(-1) == torch.arange(classes, dtype=target.dtype)).to(dtype)
    w = keep.to(dtype)
    if weight is not None:
        w = w * (onehot * weight).sum(-1)
    return onehot, w


def nll_loss_forward(x, target, weight, reduction, ignore_index):
    onehot, w = _picked(target, x.shape[-1], weight, ignore_index, x.dtype)
    losses = -(x * onehot).sum(-1) * w
    total = w.sum()
    if reduction == 0:                     # none: torch's kernel leaves total_weight 0
        return losses, total * 0
    return (losses.sum() / total if reduction == 1 else losses.sum()), total


def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    onehot, w = _picked(target, x.shape[-1], weight, ignore_index, x.dtype)
    g = grad / total_weight if reduction == 1 else grad
    return -onehot * (w * g).unsqueeze(-1)


def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    # NOTE: a one-hot matmul, not a scatter-add: every exporter has MatMul, and repeated indices sum exactly
    flat = indices.reshape(-1)
    hits = (torch.arange(num_weights, dtype=flat.dtype).unsqueeze(1) == flat.unsqueeze(0)) & (flat != padding_idx)
    onehot = hits.to(grad.dtype)
    if scale_grad_by_freq:
        onehot = onehot / onehot.sum(1, keepdim=True).clamp(min=1.0)
    return onehot @ grad.reshape(-1, grad.shape[-1])


def flash_attention_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """(output, logsumexp) as the CPU flash kernel gives them: its backward (on the fallback) reads both."""
    if dropout_p:
        raise ValueError("attention dropout has no export form (the mask is random)")
    if k.shape[-3] != q.shape[-3]:         # grouped kv heads: each serves q.heads / kv.heads query heads
        k, v = (t.unsqueeze(-3).expand(*t.shape[:-2], q.shape[-3] // t.shape[-3], *t.shape[-2:])
                .reshape(*t.shape[:-3], q.shape[-3], *t.shape[-2:]) for t in (k, v))
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def gelu_backward(grad, x, approximate="none"):
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        inner = c * (x + 0.044715 * x ** 3)
        t = torch.tanh(inner)
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))
    return grad * (cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))


def tanh_backward(grad, output):
    return grad * (1 - output * output)


def reshape(x, shape):
    # NOTE: a torch.compile graph may view a tensor that is contiguous only in AOTAutograd's own layout (a
    # transpose's output there, not in the traced module): reshape computes the same values, and it is the
    # rule both importers have (neither has one for _unsafe_view)
    return aten.reshape.default(x, shape)


FORMS = {
    aten.native_layer_norm.default: native_layer_norm,
    aten.native_layer_norm_backward.default: native_layer_norm_backward,
    aten._log_softmax.default: log_softmax,
    aten._log_softmax_backward_data.default: log_softmax_backward,
    aten.nll_loss_forward.default: nll_loss_forward,
    aten.nll_loss_backward.default: nll_loss_backward,
    aten.embedding_dense_backward.default: embedding_dense_backward,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
    aten.gelu_backward.default: gelu_backward,
    aten.tanh_backward.default: tanh_backward,
    aten.view.default: reshape,
    aten._unsafe_view.default: reshape,
    # a tensor literal's copy (`x[:, 0] = 0.5` captures lift_fresh_copy(tensor(0.5))): no exporter has a rule for it
    aten.lift_fresh_copy.default: torch.clone,
}
