"""Convolution (1-d to 3-d, grouped, dilated, transposed) and col2im: numpy kernels, cost models.

One im2col kernel serves every spelling: a transposed convolution is the direct convolution of the
stride-dilated, re-padded input with the flipped, transposed weight.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import FLOATS, arg, define


def _tuple(v, n):
    if isinstance(v, (list, tuple)):
        return tuple(v) if len(v) == n else tuple(v) * n
    return (v,) * n


def _conv_flops(n):
    w = n.input_meta[1].shape            # (C_out, C_in/groups, *k)
    per_out = 2 * math.prod(w[1:])
    return n.output_meta[0].numel * per_out


def _transposed_flops(n):
    w = n.input_meta[1].shape            # (C_in, C_out/groups, *k): every input element meets the kernel once
    return 2 * n.input_meta[0].numel * math.prod(w[1:])


def _pad_crop(x, pads):
    """Pad the spatial dims by (lo, hi) pairs; negative widths crop."""
    nd = len(pads)
    crop = [slice(None)] * (x.ndim - nd) + [slice(-min(lo, 0), x.shape[x.ndim - nd + i] + min(hi, 0))
                                            for i, (lo, hi) in enumerate(pads)]
    x = x[tuple(crop)]
    return np.pad(x, [(0, 0)] * (x.ndim - nd) + [(max(lo, 0), max(hi, 0)) for lo, hi in pads])


def _convnd(x, w, b, stride, padding, dilation, groups, nd):
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    unbatched = x.ndim == nd + 1          # F.conv2d accepts (C, H, W)
    if unbatched:
        x = x[None]
    ks = w.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        else:  # "same": torch pads the extra element on the right
            pads = []
            for k, d in zip(ks, dilation):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))
    elif padding and isinstance(padding[0], (list, tuple)):
        pads = [tuple(p) for p in padding]
    else:
        pads = [(p, p) for p in _tuple(padding, nd)]
    x = _pad_crop(x, pads)
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
    out = np.ascontiguousarray(out.astype(x.dtype, copy=False))
    return out[0] if unbatched else out


def _conv_transposend(x, w, b, stride, padding, output_padding, groups, dilation, nd):
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    padding, output_padding = _tuple(padding, nd), _tuple(output_padding, nd)
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x[None]
    n_, c = x.shape[:2]
    ks = w.shape[2:]
    # insert stride-1 zeros between input elements
    up = np.zeros((n_, c) + tuple((s - 1) * st + 1 for s, st in zip(x.shape[2:], stride)), dtype=x.dtype)
    up[(slice(None), slice(None)) + tuple(slice(None, None, st) for st in stride)] = x
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, d, p, op in zip(ks, dilation, padding, output_padding)]
    # weight (C_in, C_out/g, *k) -> (C_out, C_in/g, *k), flipped in space
    cg = c // groups
    wt = np.concatenate([np.swapaxes(w[g * cg:(g + 1) * cg], 0, 1) for g in range(groups)], axis=0)
    wt = np.flip(wt, axis=tuple(range(2, 2 + nd)))
    out = _convnd(up, np.ascontiguousarray(wt), b, 1, pads, dilation, groups, nd)
    return out[0] if unbatched else out


def _spatial(node):
    x = node.input_meta[0].shape if node.input_meta else ()
    w = node.input_meta[1].shape if len(node.input_meta) > 1 else ()
    return len(w) - 2 if w else max(len(x) - 2, 1)


@define("conv1d", "compute", aten=("aten.conv1d",), flops=_conv_flops, dtypes=FLOATS)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 1)


@define("conv2d", "compute", aten=("aten.conv2d",), flops=_conv_flops, dtypes=FLOATS)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 2)


@define("conv3d", "compute", aten=("aten.conv3d",), flops=_conv_flops, dtypes=FLOATS)
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _convnd(input, weight, bias, stride, padding, dilation, groups, 3)


def _convolution_flops(n):
    return _transposed_flops(n) if arg(n, 6, "transposed", False) else _conv_flops(n)


@define("convolution", "compute", aten=("aten.convolution", "aten._convolution"), flops=_convolution_flops,
        dtypes=FLOATS)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_flags):
    nd = weight.ndim - 2
    if transposed:
        return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, nd)
    return _convnd(input, weight, bias, stride, padding, dilation, groups, nd)


def _transpose_op(nd):
    def conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, nd)
    conv_transpose.__doc__ = f"{nd}-d transposed convolution (a.k.a. deconvolution)"
    return conv_transpose


for _nd in (1, 2, 3):
    define(f"conv_transpose{_nd}d", "compute", aten=(f"aten.conv_transpose{_nd}d",), flops=_transposed_flops,
           dtypes=FLOATS)(_transpose_op(_nd))


@define("col2im", "copy", aten=("aten.col2im",), flops=lambda n: n.input_meta[0].numel, dtypes=FLOATS)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    """Fold: sum sliding-window columns (N, C*kh*kw, L) back into an image (N, C, H, W)."""
    unbatched = self.ndim == 2
    cols = self[None] if unbatched else self
    (kh, kw), (dh, dw) = _tuple(kernel_size, 2), _tuple(dilation, 2)
    (ph, pw), (sh, sw) = _tuple(padding, 2), _tuple(stride, 2)
    h, w = _tuple(output_size, 2)
    n, ck, _ = cols.shape
    c = ck // (kh * kw)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = cols.reshape(n, c, kh, kw, oh, ow)
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=self.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw] += cols[:, :, i, j]
    out = out[:, :, ph:ph + h, pw:pw + w]
    return out[0] if unbatched else out
