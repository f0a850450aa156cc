"""Torch forms of the ATen ops that exporters lack: what a region's module runs instead, so the stack gets them.

    from opscope.runtime.export_forms import form
    form(torch.ops.aten.gelu_backward.default)(grad, x, approximate="tanh")   # plain tensor ops, traceable

Torch's TorchScript ONNX exporter and OpenVINO's importer both trace a region's module (regions.to_torch) and
convert the ATen ops they meet. A training graph is full of ops neither has a rule for -- the layer-norm, GELU,
log-softmax, NLL-loss, tanh and embedding backwards, `native_layer_norm` and the CPU flash attention's forward -- which
left the whole backward on the fallback. Each form here computes the same values from ops both convert
(matmul, sum, exp, where, comparisons), so those nodes stay in the stack's region.
NOTE: torch._decomp's decompositions are not used as they are: several test tensor conditions in Python
(`torch._check(cond)`), which a trace cannot answer, or end in ops no exporter has
(`_unsafe_masked_index_put_accumulate`).
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


def flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                                     scale=None):
    """(grad q, grad k, grad v) of softmax(q k^T * scale) v written as matmuls, from the forward's output and
    logsumexp: no exporter has the CPU flash kernel's backward, which left a training step split at every attention."""
    if dropout_p:
        raise ValueError("attention dropout has no export form (the mask is random)")
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if kv_heads != heads:                  # grouped kv heads, as the forward form expands them
        k, v = (t.unsqueeze(-3).expand(*t.shape[:-2], heads // kv_heads, *t.shape[-2:])
                .reshape(*t.shape[:-3], heads, *t.shape[-2:]) for t in (k, v))
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * sc
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    # a query every key is masked from has lse -inf: its probabilities are 0, not exp(nan)
    p = torch.where(torch.isinf(lse).unsqueeze(-1), torch.zeros_like(s), torch.exp(s - lse.unsqueeze(-1)))
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True)) * sc
    dq, dk = ds @ k, ds.transpose(-2, -1) @ q
    if kv_heads != heads:                  # each kv head's gradient sums over the query heads it served
        dk, dv = (t.reshape(*t.shape[:-3], kv_heads, heads // kv_heads, *t.shape[-2:]).sum(-3) for t in (dk, dv))
    return dq, dk, dv


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


def diff(x, n=1, dim=-1, prepend=None, append=None):
    # NOTE: neither the TorchScript exporter nor OpenVINO's importer has aten::diff (transformers' masks use it)
    parts = [t for t in (prepend, x, append) if t is not None]
    x = torch.cat(parts, dim) if len(parts) > 1 else x
    for _ in range(n):
        x = x.narrow(dim, 1, x.shape[dim] - 1) - x.narrow(dim, 0, x.shape[dim] - 1) if x.dtype != torch.bool else (
            x.narrow(dim, 1, x.shape[dim] - 1) ^ x.narrow(dim, 0, x.shape[dim] - 1))
    return x


def cumsum(x, dim, dtype=None):
    # NOTE: the exporter emits CumSum on a bool as it is, which ONNX Runtime refuses; torch sums bools as int64
    return torch.cumsum(x.to(torch.int64) if x.dtype == torch.bool else x, dim, dtype=dtype)


def histc(x, bins=100, min=0, max=0):       # noqa: A002 - ATen's argument names
    """Counts by a one-hot sum (Mixtral's router counts tokens per expert): bins as torch's CPU kernel computes
    them, (x - lo) * bins / (hi - lo) floored, the top edge in the last bin, values outside ignored."""
    lo, hi = (x.min(), x.max()) if min == max else (min, max)
    pos = ((x - lo) * bins / (hi - lo)).floor().clamp(0, bins - 1).reshape(-1, 1)
    inside = ((x >= lo) & (x <= hi)).reshape(-1, 1)
    return ((pos == torch.arange(bins, dtype=pos.dtype)) & inside).to(x.dtype).sum(0)


def grouped_mm(input, weight, offs):       # noqa: A002 - the op's argument names
    """transformers' MoE grouped matmul (rows sorted by expert, offs their cumulative counts): every row times
    every expert's weight, then each row's own expert picked by a one-hot -- a loop over offs.tolist() in its
    Python form, which no trace can follow. Rows past offs[-1] stay 0, as in its kernel."""
    rows = torch.arange(input.shape[0], dtype=offs.dtype)
    expert = (rows.unsqueeze(1) >= offs.unsqueeze(0)).sum(1)
    pick = (expert.unsqueeze(0) == torch.arange(weight.shape[0], dtype=expert.dtype).unsqueeze(1)).to(input.dtype)
    return (torch.matmul(input, weight) * pick.unsqueeze(-1)).sum(0)


def _bounds(size, start, end, step):
    start, end, step = slice(start, end, step).indices(size)
    return start, max(end, start), step


def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """x with src in place of x[start:end:step] along dim: a cat of the pieces (no exporter has slice_scatter);
    a step other than 1 interleaves by a one-hot matmul over that dim."""
    dim %= x.dim()
    start, end, step = _bounds(x.shape[dim], start, end, step)
    if step == 1:
        return torch.cat([x.narrow(dim, 0, start), src, x.narrow(dim, end, x.shape[dim] - end)], dim)
    picks = torch.arange(start, end, step)
    onehot = (torch.arange(x.shape[dim]).unsqueeze(1) == picks.unsqueeze(0)).to(x.dtype)   # (size, n)
    spread = torch.movedim(torch.movedim(src, dim, -1) @ onehot.T, -1, dim)
    return torch.where(onehot.sum(1).bool().reshape([-1 if d == dim else 1 for d in range(x.dim())]), spread, x)


def select_scatter(x, src, dim, index):
    dim %= x.dim()
    index %= x.shape[dim]
    return slice_scatter(x, src.unsqueeze(dim), dim, index, index + 1)


def slice_backward(grad, input_sizes, dim, start, end, step):
    return slice_scatter(torch.zeros(input_sizes, dtype=grad.dtype), grad, dim, start, end, step)


def select_backward(grad, input_sizes, dim, index):
    return select_scatter(torch.zeros(input_sizes, dtype=grad.dtype), grad, dim, index)


def threshold_backward(grad, x, threshold):
    return torch.where(x <= threshold, torch.zeros_like(grad), grad)


def softmax_backward(grad, output, dim, input_dtype):
    return output * (grad - (grad * output).sum(dim, keepdim=True))


def safe_softmax(x, dim, dtype=None):
    """softmax, 0 where a row is all -inf (a fully masked query) instead of NaN."""
    y = torch.softmax(x, dim)
    return torch.where((x == float("-inf")).all(dim, keepdim=True), torch.zeros_like(y), y)


def fill(x, value):
    # NOTE: the exporter fails fill in a training graph (an internal assert in TorchScript's alias analysis) and has
    # no full_like: zeros_like plus the value, cast as fill casts it
    if x.numel() == 0:                    # NOTE: OpenVINO broadcasts an empty zeros_like + value to ones in its 0 dims
        return x.clone()
    return (torch.zeros_like(x) + value).to(x.dtype)


def full_like(x, value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return fill(x if dtype is None else x.to(dtype), value)


def convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    # NOTE: a training graph's aten.convolution traced as it is fails OpenVINO's CPU plugin (`Check 'newNode'
    # failed`, ViT's patch embedding); the functional conv it stands for converts
    import torch.nn.functional as F
    nd = x.dim() - 2
    if transposed:
        return (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1](x, w, b, stride, padding,
                                                                                   output_padding, groups, dilation)
    return (F.conv1d, F.conv2d, F.conv3d)[nd - 1](x, w, b, stride, padding, dilation, groups)


def _conv(nd, transposed=False):
    import torch.nn.functional as F
    return ((F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d) if transposed else
            (F.conv1d, F.conv2d, F.conv3d))[nd - 1]


def _conv_weight_grad(x, g, kernel, stride, padding, dilation, groups):
    """The weight gradient of conv(x) -> y given grad y = g: per group, a convolution of x (channels as the batch)
    with g (its batch as channels), stride and dilation swapped, cut to the kernel's size."""
    nd = x.dim() - 2
    cg, cog = x.shape[1] // groups, g.shape[1] // groups
    parts = []
    for i in range(groups):
        xg, gg = x.narrow(1, i * cg, cg).transpose(0, 1), g.narrow(1, i * cog, cog).transpose(0, 1)
        w = _conv(nd)(xg, gg, None, dilation, padding, stride)            # (cg, cog, >= kernel)
        for d, size in enumerate(kernel):
            w = w.narrow(2 + d, 0, size)
        parts.append(w.transpose(0, 1))
    return torch.cat(parts, 0) if groups > 1 else parts[0]


def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         mask):
    """(grad input, grad weight, grad bias) from convolutions every exporter has: a direct convolution's input
    gradient is the transposed convolution of grad with the same weight (and a transposed one's the direct one)."""
    nd = x.dim() - 2
    stride, padding, dilation = ([a] * nd if isinstance(a, int) else list(a) for a in (stride, padding, dilation))
    kernel = list(w.shape[2:])
    gx = gw = None
    if transposed:
        if mask[0]:
            gx = _conv(nd)(grad, w, None, stride, padding, dilation, groups)
        if mask[1]:                        # the direct convolution it is the input gradient of, roles swapped
            gw = _conv_weight_grad(grad, x, kernel, stride, padding, dilation, groups)
    else:
        if mask[0]:
            extra = [x.shape[2 + d] - ((grad.shape[2 + d] - 1) * stride[d] - 2 * padding[d]
                                       + dilation[d] * (kernel[d] - 1) + 1) for d in range(nd)]
            gx = _conv(nd, transposed=True)(grad, w, None, stride, padding, extra, groups, dilation)
        if mask[1]:
            gw = _conv_weight_grad(x, grad, kernel, stride, padding, dilation, groups)
    gb = grad.sum([0] + list(range(2, grad.dim()))) if mask[2] else None
    return gx, gw, gb


def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    g = x.reshape(n, group, -1)
    mean = g.mean(-1, keepdim=True)
    centred = g - mean
    rstd = torch.rsqrt((centred * centred).mean(-1, keepdim=True) + eps)
    per_channel = [1, c] + [1] * (x.dim() - 2)
    y = (centred * rstd).reshape(x.shape)
    y = y * weight.reshape(per_channel) if weight is not None else y
    y = y + bias.reshape(per_channel) if bias is not None else y
    return y, mean.squeeze(-1), rstd.squeeze(-1)


def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, mask):
    """From the saved statistics, as ATen's kernel: per group, rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    per_channel = [1, c] + [1] * (x.dim() - 2)
    mean, rstd = mean.unsqueeze(-1), rstd.unsqueeze(-1)
    xhat = (x.reshape(n, group, -1) - mean) * rstd
    g = (grad * weight.reshape(per_channel) if weight is not None else grad).reshape(n, group, -1)
    gx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    spatial = [0] + list(range(2, x.dim()))
    gw = (grad * xhat.reshape(x.shape)).sum(spatial) if weight is not None and mask[1] else None
    return gx.reshape(x.shape) if mask[0] else None, gw, grad.sum(spatial) if mask[2] else None


def _norm_axes(v, dim):
    return [a for a in range(v.dim()) if a != dim % v.dim()]


def weight_norm_interface(v, g, dim=0):
    """(g * v / ||v||, ||v||): the norm over every dim but `dim`, shaped as g (Wav2Vec2's positional conv)."""
    norms = torch.sqrt((v * v).sum(_norm_axes(v, dim), keepdim=True))
    return v * (g.reshape(norms.shape) / norms), norms.reshape(g.shape)


def weight_norm_interface_backward(grad_w, v, g, norms, dim):
    axes = _norm_axes(v, dim)
    norms = norms.reshape([v.shape[a] if a not in axes else 1 for a in range(v.dim())])
    grad_g = (grad_w * v).sum(axes, keepdim=True) / norms
    grad_v = g.reshape(norms.shape) / norms * (grad_w - v * grad_g / norms)
    return grad_v, grad_g.reshape(g.shape)


def bitwise_and(x, y):
    # NOTE: the exporter registers `&` only (as aten::__and_, ONNX's And, bools only): a mask's bitwise_and of two
    # bools (Llama's causal mask) is their logical and. Integers stay bitwise_and: OpenVINO converts it, ONNX has no
    # BitwiseAnd before opset 18 (ONNX Runtime's claim refuses them)
    if x.dtype == torch.bool and y.dtype == torch.bool:
        return torch.logical_and(x, y)
    return torch.bitwise_and(x, y)


def copy(x, src, non_blocking=False):
    # NOTE: OpenVINO's importer converts the functional aten::copy (what a training graph makes of `x.copy_(src)`,
    # `x[1:] = y`) as its first input, the values it overwrites: T5's label shift and Wav2Vec2's SpecAugment trained
    # to wrong values with no error. Its meaning, src cast and broadcast to x, traces into ops every stack converts
    return src.to(x.dtype).expand(x.shape).clone()


def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # NOTE: the device argument traces as a prim::Constant of a Device, which OpenVINO cannot convert: the region
    # runs where the stack put it, so only the dtype matters
    return x.to(dtype) if dtype is not None else x.clone()


# ops of other libraries' namespaces, by schema name: their OpOverload exists only once the library registered it
BY_NAME = {"transformers::grouped_mm_fallback": grouped_mm}


def form(target):
    """The torch form an exporter traces instead of `target`, or None where it converts the op as it is."""
    found = FORMS.get(target)
    if found is None and (schema := getattr(target, "_schema", None)) is not None:
        found = BY_NAME.get(schema.name)
    return found


FORMS = {
    aten.diff.default: diff,
    aten.convolution.default: convolution,
    aten._to_copy.default: to_copy,
    aten.copy.default: copy,
    aten.fill.Scalar: fill,
    aten.fill.Tensor: fill,
    aten.full_like.default: full_like,
    aten.slice_scatter.default: slice_scatter,
    aten.select_scatter.default: select_scatter,
    aten.slice_backward.default: slice_backward,
    aten.select_backward.default: select_backward,
    aten.threshold_backward.default: threshold_backward,
    aten._softmax_backward_data.default: softmax_backward,
    aten._safe_softmax.default: safe_softmax,
    aten.cumsum.default: cumsum,
    aten.histc.default: histc,
    aten.native_layer_norm.default: native_layer_norm,
    aten.native_layer_norm_backward.default: native_layer_norm_backward,
    aten._log_softmax.default: log_softmax,
    aten._log_softmax_backward_data.default: log_softmax_backward,
    aten.nll_loss_forward.default: nll_loss_forward,
    aten.nll_loss_backward.default: nll_loss_backward,
    aten.embedding_dense_backward.default: embedding_dense_backward,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_for_cpu_backward,
    aten.convolution_backward.default: convolution_backward,
    aten.native_group_norm.default: native_group_norm,
    aten.native_group_norm_backward.default: native_group_norm_backward,
    aten._weight_norm_interface.default: weight_norm_interface,
    aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    aten.bitwise_and.Tensor: bitwise_and,
    aten.gelu_backward.default: gelu_backward,
    aten.tanh_backward.default: tanh_backward,
    aten.view.default: reshape,
    aten._unsafe_view.default: reshape,
    # a tensor literal's copy (`x[:, 0] = 0.5` captures lift_fresh_copy(tensor(0.5))): no exporter has a rule for it
    aten.lift_fresh_copy.default: torch.clone,
}
