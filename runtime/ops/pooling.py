"""Pooling (max, average, adaptive; 1-d to 3-d) and upsampling: numpy kernels and cost models.

Every pool is a strided window view over the padded input: (..., *out, *kernel), reduced over the
kernel axes. Max pooling with indices reduces a window view of the flat input positions alongside.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .registry import FLOATS, arg, define


def _tuple(v, n):
    if isinstance(v, (list, tuple)):
        return tuple(v) if len(v) == n else tuple(v) * n
    return (v,) * n


def _reads_input(n):
    return n.input_meta[0].numel


def _out_sizes(sizes, kernel, stride, padding, dilation, ceil_mode):
    outs = []
    for s, k, st, p, d in zip(sizes, kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        o = (s + 2 * p - span + (st - 1 if ceil_mode else 0)) // st + 1
        if ceil_mode and (o - 1) * st >= s + p:   # the last window must start inside the input or left pad
            o -= 1
        outs.append(o)
    return outs


def _windows(x, nd, kernel, stride, padding, dilation, ceil_mode, fill):
    """(..., *out, *kernel) window view of x padded with `fill` (plus the ceil-mode overhang)."""
    kernel = _tuple(kernel, nd)
    stride = _tuple(stride, nd) if stride not in (None, [], ()) else kernel
    padding, dilation = _tuple(padding, nd), _tuple(dilation, nd)
    sizes = x.shape[-nd:]
    outs = _out_sizes(sizes, kernel, stride, padding, dilation, ceil_mode)
    extra = [max(0, (o - 1) * st + d * (k - 1) + 1 - s - 2 * p)
             for o, st, k, s, p, d in zip(outs, stride, kernel, sizes, padding, dilation)]
    pad = [(0, 0)] * (x.ndim - nd) + [(p, p + e) for p, e in zip(padding, extra)]
    xp = np.pad(x, pad, constant_values=fill)
    axes = tuple(range(-nd, 0))
    win = np.lib.stride_tricks.sliding_window_view(xp, [d * (k - 1) + 1 for k, d in zip(kernel, dilation)], axis=axes)
    sl = (Ellipsis,) + tuple(slice(None, o * st, st) for o, st in zip(outs, stride)) + \
        tuple(slice(None, None, d) for d in dilation)
    return win[sl], kernel, stride, padding


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode, with_indices):
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    win, *_ = _windows(x, nd, kernel_size, stride, padding, dilation, ceil_mode, low)
    kaxes = tuple(range(-nd, 0))
    values = win.max(axis=kaxes).astype(x.dtype)
    if not with_indices:
        return values
    flat = np.arange(math.prod(x.shape[-nd:]), dtype=np.int64).reshape(x.shape[-nd:])
    iwin, *_ = _windows(flat, nd, kernel_size, stride, padding, dilation, ceil_mode, -1)
    k = math.prod(win.shape[-nd:])
    wflat = win.reshape(win.shape[:-nd] + (k,))
    pos = wflat.argmax(axis=-1)[..., None]                     # the first maximum, as torch picks
    iflat = np.broadcast_to(iwin.reshape(iwin.shape[:-nd] + (k,)), wflat.shape)
    return values, np.take_along_axis(iflat, pos, axis=-1)[..., 0]


def _pool_defs(nd):
    def max_pool(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool(self, nd, kernel_size, stride, padding, dilation, ceil_mode, False)

    def max_pool_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool(self, nd, kernel_size, stride, padding, dilation, ceil_mode, True)

    def avg_pool(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        win, kernel, stride_, pad = _windows(self, nd, kernel_size, stride, padding, 1, ceil_mode, 0)
        total = win.sum(axis=tuple(range(-nd, 0)))
        if divisor_override:
            return (total / divisor_override).astype(self.dtype)
        ones = np.ones(self.shape[-nd:], dtype=np.float64)
        if count_include_pad:       # the padding counts, the ceil-mode overhang does not
            ones = np.pad(ones, [(p, p) for p in pad], constant_values=1.0)
            cwin, *_ = _windows(ones, nd, kernel, stride_, 0, 1, ceil_mode, 0)
        else:
            cwin, *_ = _windows(ones, nd, kernel, stride_, pad, 1, ceil_mode, 0)
        count = cwin.sum(axis=tuple(range(-nd, 0)))[tuple(slice(None, s) for s in total.shape[-nd:])]
        return (total / count).astype(self.dtype)
    return max_pool, max_pool_with_indices, avg_pool


for _nd in (1, 2, 3):
    _max, _maxi, _avg = _pool_defs(_nd)
    define(f"max_pool{_nd}d", "reduction", aten=(f"aten.max_pool{_nd}d",), flops=_reads_input)(_max)
    define(f"max_pool{_nd}d_with_indices", "reduction", aten=(f"aten.max_pool{_nd}d_with_indices",),
           flops=_reads_input)(_maxi)
    define(f"avg_pool{_nd}d", "reduction", aten=(f"aten.avg_pool{_nd}d",), flops=_reads_input)(_avg)


# --- adaptive pooling --------------------------------------------------------------------
def _adaptive_bounds(size, out):
    return [(math.floor(i * size / out), math.ceil((i + 1) * size / out)) for i in range(out)]


def _adaptive(x, output_size, nd, reduce):
    outs = [o if o is not None else s for o, s in zip(_tuple(output_size, nd), x.shape[-nd:])]
    sizes = x.shape[-nd:]
    if reduce is np.mean and all(s % o == 0 for s, o in zip(sizes, outs)):   # even tiles: one reshape
        shape = x.shape[:-nd] + tuple(v for s, o in zip(sizes, outs) for v in (o, s // o))
        return x.reshape(shape).mean(axis=tuple(-2 * i - 1 for i in range(nd))).astype(x.dtype)
    out = np.empty(x.shape[:-nd] + tuple(outs), dtype=x.dtype)
    idx = np.empty(out.shape, dtype=np.int64)
    bounds = [_adaptive_bounds(s, o) for s, o in zip(sizes, outs)]
    for pos in itertools.product(*[range(o) for o in outs]):
        box = tuple(slice(*bounds[a][p]) for a, p in enumerate(pos))
        region = x[(Ellipsis,) + box]
        flat = region.reshape(region.shape[:-nd] + (math.prod(region.shape[-nd:]),))
        out[(Ellipsis,) + pos] = reduce(flat, axis=-1)
        if reduce is np.max:      # index into the flat input plane, as torch reports it
            local = np.unravel_index(flat.argmax(axis=-1), region.shape[-nd:])
            starts = [bounds[a][p][0] for a, p in enumerate(pos)]
            idx[(Ellipsis,) + pos] = np.ravel_multi_index([loc + s for loc, s in zip(local, starts)], sizes)
    return (out, idx) if reduce is np.max else out


for _nd in (1, 2, 3):
    define(f"adaptive_avg_pool{_nd}d", "reduction", flops=_reads_input,
           aten=(f"aten.adaptive_avg_pool{_nd}d",) + ((f"aten._adaptive_avg_pool{_nd}d",) if _nd > 1 else ()))(
        lambda self, output_size, _nd=_nd: _adaptive(self, output_size, _nd, np.mean))
    define(f"adaptive_max_pool{_nd}d", "reduction", aten=(f"aten.adaptive_max_pool{_nd}d",), flops=_reads_input)(
        lambda self, output_size, _nd=_nd: _adaptive(self, output_size, _nd, np.max))


# --- upsampling --------------------------------------------------------------------------
def _scales(node_in, output_size, scale_factors, nd, scales):
    """Output sizes and the source step per output pixel, the way ATen computes both."""
    sizes = node_in.shape[-nd:]
    if output_size is None:
        output_size = [int(math.floor(s * f)) for s, f in zip(sizes, scale_factors)]
        scales = scale_factors
    scales = (list(scales) if scales is not None else [])[:nd]
    scales += [None] * (nd - len(scales))
    steps = [1.0 / f if f else s / o for s, o, f in zip(sizes, output_size, scales)]
    return list(output_size), steps


def _upsample_args(nd, args):
    # .vec: (input, output_size?, scale_factors?) ; .default: (input, output_size, *scales per dim)
    output_size = args[0] if args else None
    rest = args[1:]
    if rest and isinstance(rest[0], (list, tuple)) or (len(rest) == 1 and rest[0] is None):
        return output_size, rest[0], None
    return output_size, None, list(rest[:nd]) if rest else None


def _nearest(nd, exact=False):
    def upsample_nearest(self, *args):
        output_size, factors, scales = _upsample_args(nd, args)
        outs, steps = _scales(self, output_size, factors, nd, scales)
        out = self
        for a, (o, step, s) in enumerate(zip(outs, steps, self.shape[-nd:])):
            src = np.floor((np.arange(o) + (0.5 if exact else 0.0)) * step).astype(np.int64)
            out = np.take(out, np.minimum(src, s - 1), axis=self.ndim - nd + a)
        return out
    return upsample_nearest


def _linear_axis(x, axis, o, step, align_corners):
    s = x.shape[axis]
    d = np.arange(o, dtype=np.float64)
    if align_corners:
        src = d * ((s - 1) / (o - 1)) if o > 1 else np.zeros(o)
    else:
        src = np.maximum((d + 0.5) * step - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), s - 1)
    i1 = np.minimum(i0 + 1, s - 1)
    lam = (src - i0).reshape((-1,) + (1,) * (x.ndim - 1 - axis % x.ndim))
    a, b = np.take(x, i0, axis=axis), np.take(x, i1, axis=axis)
    return a * (1 - lam) + b * lam


def _linear(nd):
    def upsample_linear(self, output_size, align_corners, *rest):
        if rest and isinstance(rest[0], (list, tuple)):          # .vec: (input, output_size, align_corners, factors)
            factors, scales = rest[0], None
        else:
            factors, scales = None, list(rest[:nd]) if rest else None
        outs, steps = _scales(self, output_size, factors, nd, scales)
        out = self.astype(np.float64)
        for a, (o, step) in enumerate(zip(outs, steps)):
            if align_corners:
                step = None
            out = _linear_axis(out, self.ndim - nd + a, o, step, align_corners)
        return out.astype(self.dtype)
    return upsample_linear


for _nd in (1, 2, 3):
    define(f"upsample_nearest{_nd}d", "copy", aten=(f"aten.upsample_nearest{_nd}d",), flops=lambda n: 0)(_nearest(_nd))
    define(f"upsample_nearest_exact{_nd}d", "copy", aten=(f"aten._upsample_nearest_exact{_nd}d",),
           flops=lambda n: 0)(_nearest(_nd, exact=True))
define("upsample_linear1d", "elementwise", aten=("aten.upsample_linear1d",), dtypes=FLOATS,
       flops=lambda n: 3 * n.output_meta[0].numel)(_linear(1))
define("upsample_bilinear2d", "elementwise", aten=("aten.upsample_bilinear2d",), dtypes=FLOATS,
       flops=lambda n: 6 * n.output_meta[0].numel)(_linear(2))
define("upsample_trilinear3d", "elementwise", aten=("aten.upsample_trilinear3d",), dtypes=FLOATS,
       flops=lambda n: 9 * n.output_meta[0].numel)(_linear(3))


def _grid_accepts(node):
    if node.input_meta and len(node.input_meta[0].shape) != 4:
        return "grid_sampler: the numpy kernel samples 2-d images (N, C, H, W) only"
    mode, padding = arg(node, 2, "interpolation_mode", 0), arg(node, 3, "padding_mode", 0)
    if mode not in (0, 1) or padding not in (0, 1):
        return "grid_sampler_2d: the numpy kernel does bilinear/nearest with zeros/border padding only"
    return True


@define("grid_sampler_2d", "elementwise", aten=("aten.grid_sampler_2d", "aten.grid_sampler"), dtypes=FLOATS, accepts=_grid_accepts,
        flops=lambda n: 8 * n.output_meta[0].numel)
def grid_sampler_2d(input, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Sample input (N, C, H, W) at grid (N, Ho, Wo, 2) points in [-1, 1]; bilinear (0) or nearest (1)."""
    n, c, h, w = input.shape
    gx, gy = grid[..., 0].astype(np.float64), grid[..., 1].astype(np.float64)

    def unnorm(g, size):
        return ((g + 1) / 2) * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
    x, y = unnorm(gx, w), unnorm(gy, h)
    if padding_mode == 1:      # border: clip the coordinates
        x, y = np.clip(x, 0, w - 1), np.clip(y, 0, h - 1)
    batch = np.arange(n)[:, None, None]

    def pick(yi, xi):
        inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
        v = input[batch, :, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]       # N, Ho, Wo, C
        return np.where(inside[..., None], v, 0.0)
    if interpolation_mode == 1:
        out = pick(np.round(y).astype(np.int64), np.round(x).astype(np.int64))   # rounds half to even, as ATen
    else:
        x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
        wx, wy = (x - x0)[..., None], (y - y0)[..., None]
        out = (pick(y0, x0) * (1 - wx) * (1 - wy) + pick(y0, x0 + 1) * wx * (1 - wy)
               + pick(y0 + 1, x0) * (1 - wx) * wy + pick(y0 + 1, x0 + 1) * wx * wy)
    return np.moveaxis(out, -1, 1).astype(input.dtype)
