"""The FFT primitives torch.fft lowers to (_fft_r2c, _fft_c2r, _fft_c2c): numpy.fft kernels.

ATen's `normalization` argument: 0 no scaling, 1 by 1/sqrt(n), 2 by 1/n -- applied to the transform
being computed, whichever direction it is.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import ALL_DTYPES, COMPLEX, define

_FORWARD = {0: "backward", 1: "ortho", 2: "forward"}     # numpy's name for "scale the forward by ..."
_INVERSE = {0: "forward", 1: "ortho", 2: "backward"}


def _fft_flops(n):
    m = n.input_meta[0]
    return int(5 * m.numel * max(1.0, math.log2(max(m.numel, 2))))


@define("fft_r2c", "compute", aten=("aten._fft_r2c",), flops=_fft_flops, dtypes=ALL_DTYPES | COMPLEX)
def fft_r2c(self, dim, normalization, onesided):
    """Real-to-complex FFT over `dim`; onesided keeps the last dim's non-negative frequencies."""
    x = self.astype(np.float64)
    out = np.fft.rfftn(x, axes=dim, norm=_FORWARD[normalization]) if onesided else \
        np.fft.fftn(x, axes=dim, norm=_FORWARD[normalization])
    return out.astype(np.complex64 if self.dtype != np.float64 else np.complex128)


@define("fft_c2r", "compute", aten=("aten._fft_c2r",), flops=_fft_flops, dtypes=ALL_DTYPES | COMPLEX)
def fft_c2r(self, dim, normalization, last_dim_size):
    """Complex-to-real inverse FFT over `dim` (Hermitian input, last dim of size last_dim_size)."""
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = np.fft.irfftn(self.astype(np.complex128), s=sizes, axes=dim, norm=_INVERSE[normalization])
    return out.astype(np.float32 if self.dtype == np.complex64 else np.float64)


@define("fft_c2c", "compute", aten=("aten._fft_c2c",), flops=_fft_flops, dtypes=ALL_DTYPES | COMPLEX)
def fft_c2c(self, dim, normalization, forward):
    x = self.astype(np.complex128)
    out = np.fft.fftn(x, axes=dim, norm=_FORWARD[normalization]) if forward else \
        np.fft.ifftn(x, axes=dim, norm=_INVERSE[normalization])
    return out.astype(self.dtype)
