"""FLOPs and bytes of the matmul family from the shapes torch.profiler records (record_shapes=True).

    cost("aten::addmm", [[32], [8, 16], [16, 32]], ["float", "float", "float"], concrete)   # -> (8192, 3712)

The trace records input shapes only, so each op's output shape is worked out from its inputs (for
convolutions with the stride, padding and dilation in 'Concrete Inputs'). The formulas are the
runtime's cost models (runtime/ops/nn.py, convolution.py): 2 * output elements * reduced length.
Bytes: inputs read plus output written, at each dtype's size. None where the shapes do not say.
"""
from __future__ import annotations

import math

_SIZES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2, "int8": 1,
          "uint8": 1, "bool": 1}
MATMUL_FAMILY = frozenset(f"aten::{n}" for n in (
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d", "convolution",
    "_convolution", "cudnn_convolution", "mkldnn_convolution", "_mkldnn_convolution", "_convolution_mode",
    "miopen_convolution", "_nnpack_spatial_convolution", "slow_conv2d_forward", "thnn_conv2d"))
_INT64_MAX = (1 << 63) - 1
_CONV_SPATIAL = {"aten::conv1d": 1, "aten::conv2d": 2, "aten::conv3d": 3}


def cost(name: str, dims: list, dtypes: list, concrete) -> tuple[int, int] | None:
    """-> (FLOPs, bytes) of one call, or None. dims: every input's shape as recorded (scalars are [])."""
    try:
        got = _flops_and_out(name, dims, concrete if isinstance(concrete, list) else [])
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if got is None:
        return None
    flops, out = got
    if flops < 0 or any(d < 0 for d in out):
        return None
    size = _SIZES.get(next((t for t in dtypes if t in _SIZES), None), 4)
    moved = (sum(math.prod(d) for d in dims if isinstance(d, list) and d) + math.prod(out)) * size
    if not 0 <= moved <= _INT64_MAX or flops > _INT64_MAX:     # shapes from a hostile file: no count at all
        return None
    return int(flops), int(moved)


def _ints(shape) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in shape):
        raise TypeError
    return shape


def _flops_and_out(name, dims, concrete):
    a = _ints(dims[0]) if dims else None
    if name in ("aten::mm",):
        b = _ints(dims[1])
        return 2 * a[0] * a[1] * b[1], [a[0], b[1]]
    if name in ("aten::addmm",):             # (bias, mat1, mat2)
        m1, m2 = _ints(dims[1]), _ints(dims[2])
        return 2 * m1[0] * m1[1] * m2[1], [m1[0], m2[1]]
    if name == "aten::bmm":
        b = _ints(dims[1])
        return 2 * a[0] * a[1] * a[2] * b[2], [a[0], a[1], b[2]]
    if name == "aten::baddbmm":              # (self, batch1, batch2)
        b1, b2 = _ints(dims[1]), _ints(dims[2])
        return 2 * b1[0] * b1[1] * b1[2] * b2[2], [b1[0], b1[1], b2[2]]
    if name == "aten::matmul":
        return _matmul(a, _ints(dims[1]))
    if name == "aten::linear":               # (input [..., K], weight [N, K], bias [N]?)
        w = _ints(dims[1])
        rows = math.prod(a[:-1])
        bias = len(dims) > 2 and isinstance(dims[2], list) and bool(dims[2])
        return 2 * rows * a[-1] * w[0] + (rows * w[0] if bias else 0), a[:-1] + [w[0]]
    if name in MATMUL_FAMILY:                # convolutions: (input, weight, bias, stride, padding, dilation, ...)
        return _conv(name, a, _ints(dims[1]), concrete)
    return None


def _matmul(a, b):
    if len(a) == 1 and len(b) == 1:
        return 2 * a[0], []
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    batch = _broadcast(a[:-2], b[:-2])
    out = batch + ([m] if len(a) > 1 else []) + ([n] if len(b) > 1 else [])
    return 2 * math.prod(batch) * m * n * a[-1], out


def _broadcast(x, y):
    n = max(len(x), len(y))
    x, y = [1] * (n - len(x)) + x, [1] * (n - len(y)) + y
    return [max(p, q) for p, q in zip(x, y)]


def _conv(name, x, w, concrete):
    spatial = len(w) - 2
    if spatial < 1 or len(x) not in (spatial + 1, spatial + 2) or _CONV_SPATIAL.get(name, spatial) != spatial:
        return None
    if name == "aten::convolution" or name == "aten::_convolution":
        if _text(concrete, 6) == "True":     # transposed: every input element meets the kernel once
            return None
    stride = _tuple(concrete, 3, spatial, 1)
    padding_text = _text(concrete, 4)
    dilation = _tuple(concrete, 5, spatial, 1)
    if padding_text is not None and padding_text.strip("'\"") == "same":
        out_sp = [math.ceil(n / s) for n, s in zip(x[-spatial:], stride)]
    else:
        padding = [0] * spatial if padding_text is not None and padding_text.strip("'\"") == "valid" else \
            _tuple(concrete, 4, spatial, 0)
        out_sp = [(n + 2 * p - d * (k - 1) - 1) // s + 1
                  for n, p, d, k, s in zip(x[-spatial:], padding, dilation, w[2:], stride)]
    out = x[:-spatial - 1] + [w[0]] + out_sp
    return 2 * math.prod(out) * math.prod(w[1:]), out


def _text(concrete, i):
    v = concrete[i] if len(concrete) > i else None
    return v if isinstance(v, str) and v else None


def _tuple(concrete, i, n, default):
    """'[2, 2]' or '2' from Concrete Inputs -> n ints; the default where it was not recorded."""
    v = _text(concrete, i)
    if v is None:
        return [default] * n
    parts = [int(p) for p in v.strip("[]() ").split(",") if p.strip()]
    if len(parts) == 1:
        parts = parts * n
    if len(parts) != n or any(p <= 0 for p in parts) and default == 1:
        raise ValueError
    return parts
