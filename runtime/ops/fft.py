"""The FFT primitives torch.fft lowers to (_fft_r2c, _fft_c2r, _fft_c2c): numpy.fft kernels.

ATen's `normalization` argument: 0 no scaling, 1 by 1/sqrt(n), 2 by 1/n -- applied to the transform
being computed, whichever direction it is.
"""
from __future__ import annotations

import math

import numpy as np

import torch

from ..samples import F32_64, SAMPLES, C, F, Sample, Z
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


# --- torch.fft's own functions (fft2, ifftn, hfft, ...), which capture keeps whole: numpy.fft's namesakes -------
_SWAP = {"backward": "forward", "forward": "backward", "ortho": "ortho"}   # hfft is irfft of the conjugate, scaled


def _wide(x):
    x = np.asarray(x)
    return x.astype(np.complex128) if x.dtype.kind == "c" else x.astype(np.float64)


def _sizes(x, s, dim, last_real=False):
    """numpy's (s, axes) for torch's: -1 in s keeps that dim's size (for a c2r last dim, 2 (n - 1))."""
    if dim is not None:
        dim = [dim] if isinstance(dim, int) else list(dim)
    if s is None:
        return None, dim
    s = list(s)
    axes = dim if dim is not None else list(range(x.ndim - len(s), x.ndim))
    out = []
    for i, (n, d) in enumerate(zip(s, axes)):
        if n == -1:
            n = 2 * (x.shape[d] - 1) if last_real and i == len(s) - 1 else x.shape[d]
        out.append(n)
    return out, axes


def _fft_fn(numpy_fn, default_dim, kind="c2c"):
    def kernel(self, s=None, dim=default_dim, norm=None, n=None):
        x = _wide(self)
        if numpy_fn in ("ifft", "irfft", "hfft", "ihfft"):      # 1-d: (n, dim)
            n, axis = s if n is None else n, dim
            if kind == "c2r" and n is None:
                n = 2 * (x.shape[axis] - 1)
            return _one_d(numpy_fn, x, n, axis, norm or "backward")
        sizes, axes = _sizes(x, s, dim, last_real=kind == "c2r")
        return _n_d(numpy_fn, x, sizes, axes, norm or "backward")
    return kernel


def _one_d(name, x, n, axis, norm):
    if name == "hfft":
        return np.fft.irfft(np.conj(x), n, axis=axis, norm=_SWAP[norm])
    if name == "ihfft":
        return np.conj(np.fft.rfft(x, n, axis=axis, norm=_SWAP[norm]))
    return getattr(np.fft, name)(x, n, axis=axis, norm=norm)


def _n_d(name, x, sizes, axes, norm):
    base = name.rstrip("2n")
    if base == "hfft":
        return np.fft.irfftn(np.conj(x), sizes, axes=axes, norm=_SWAP[norm])
    if base == "ihfft":
        return np.conj(np.fft.rfftn(x, sizes, axes=axes, norm=_SWAP[norm]))
    return getattr(np.fft, base + "n")(x, sizes, axes=axes, norm=norm)


for _name, _dim, _kind in [("fft2", (-2, -1), "c2c"), ("fftn", None, "c2c"), ("ifft", -1, "c2c"),
                           ("ifft2", (-2, -1), "c2c"), ("ifftn", None, "c2c"), ("irfft", -1, "c2r"),
                           ("irfft2", (-2, -1), "c2r"), ("irfftn", None, "c2r"), ("hfft", -1, "c2r"),
                           ("hfft2", (-2, -1), "c2r"), ("hfftn", None, "c2r"), ("ihfft", -1, "r2c"),
                           ("ihfft2", (-2, -1), "r2c"), ("ihfftn", None, "r2c")]:
    define(f"fft_{_name}", "compute", aten=(f"aten.fft_{_name}",), flops=_fft_flops,
           dtypes=ALL_DTYPES | COMPLEX)(_fft_fn(_name, _dim, _kind))


aten = torch.ops.aten
SAMPLES.update({
    "fft_fft2": Sample(aten.fft_fft2.default, [(F(4, 6),), C(Z(2, 4, 5), s=[3, 8], norm="ortho")], F32_64),
    "fft_fftn": Sample(aten.fft_fftn.default, [(F(4, 6),), C(Z(2, 4, 5), dim=[0, 2], norm="forward")], F32_64),
    "fft_ifft": Sample(aten.fft_ifft.default, [(Z(4, 6),), C(F(4, 5), n=8, dim=0, norm="ortho")], F32_64),
    "fft_ifft2": Sample(aten.fft_ifft2.default, [(Z(4, 6),), C(Z(2, 4, 5), s=[3, -1])], F32_64),
    "fft_ifftn": Sample(aten.fft_ifftn.default, [(Z(4, 6),), C(F(2, 4, 5), dim=[1], norm="forward")], F32_64),
    "fft_irfft": Sample(aten.fft_irfft.default, [(Z(4, 5),), C(Z(4, 5), n=7, dim=0, norm="ortho")], F32_64),
    "fft_irfft2": Sample(aten.fft_irfft2.default, [(Z(4, 5),), C(Z(2, 4, 5), s=[4, 6])], F32_64),
    "fft_irfftn": Sample(aten.fft_irfftn.default, [(Z(4, 5),), C(Z(2, 4, 5), dim=[0, 2], norm="forward")], F32_64),
    "fft_hfft": Sample(aten.fft_hfft.default, [(Z(4, 5),), C(Z(4, 5), n=7, dim=0, norm="ortho")], F32_64),
    "fft_hfft2": Sample(aten.fft_hfft2.default, [(Z(4, 5),), C(Z(2, 4, 5), s=[4, 6])], F32_64),
    "fft_hfftn": Sample(aten.fft_hfftn.default, [(Z(4, 5),), C(Z(2, 4, 5), dim=[0, 2], norm="forward")], F32_64),
    "fft_ihfft": Sample(aten.fft_ihfft.default, [(F(4, 6),), C(F(4, 5), n=8, dim=0, norm="ortho")], F32_64),
    "fft_ihfft2": Sample(aten.fft_ihfft2.default, [(F(4, 6),), C(F(2, 4, 5), s=[3, 6])], F32_64),
    "fft_ihfftn": Sample(aten.fft_ihfftn.default, [(F(4, 6),), C(F(2, 4, 5), dim=[0, 2], norm="forward")], F32_64),
})
