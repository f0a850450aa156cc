"""Scatter, index_put, index_add, masked_scatter, nonzero, one_hot and the *_scatter views:
numpy kernels. What Mixture-of-Experts routing is built from (topk lives in sorting.py)."""
from __future__ import annotations

import numpy as np

from .registry import define


def _dim(d, ndim):
    return d + ndim if d < 0 else d


def _along(index, dim):
    """Advanced-index tuple addressing self[..., index[i, j, ...] (at dim), ...] for every index position."""
    grids = list(np.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def _src(src, index, dtype):
    if not isinstance(src, np.ndarray) or src.ndim == 0:
        return np.broadcast_to(np.asarray(src, dtype=dtype), index.shape)
    return src[tuple(slice(0, s) for s in index.shape)].astype(dtype, copy=False)


_UFUNC = {"sum": np.add, "add": np.add, "prod": np.multiply, "multiply": np.multiply, "amax": np.maximum,
          "amin": np.minimum}


@define("scatter", "copy", aten=("aten.scatter", "aten.scatter_"))
def scatter(self, dim, index, src=None, *, reduce=None, value=None):
    """out[..., index[i], ...] = src[i] (scatter.src / .value), or combined by `reduce`."""
    if src is None:
        src = value
    out = self.copy()
    if self.ndim == 0:
        return np.asarray(src, dtype=self.dtype).reshape(()) if index.size else out
    dim = _dim(dim, self.ndim)
    idx, vals = _along(index, dim), _src(src, index, self.dtype)
    if reduce is None:
        out[idx] = vals
    else:
        _UFUNC[reduce].at(out, idx, vals)
    return out


@define("scatter_add", "copy", aten=("aten.scatter_add", "aten.scatter_add_"))
def scatter_add(self, dim, index, src):
    out = self.copy()
    if self.ndim == 0:
        return out + src.reshape(()) if index.size else out
    np.add.at(out, _along(index, _dim(dim, self.ndim)), _src(src, index, self.dtype))
    return out


@define("scatter_reduce", "copy", aten=("aten.scatter_reduce", "aten.scatter_reduce_"))
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    """Combine src into self at index by sum / prod / mean / amax / amin."""
    if self.ndim == 0:
        self, index, src = self.reshape(1), index.reshape(-1), np.asarray(src).reshape(-1)
        return scatter_reduce(self, 0, index, src, reduce, include_self=include_self).reshape(())
    dim = _dim(dim, self.ndim)
    idx, vals = _along(index, dim), _src(src, index, np.float64 if reduce == "mean" else self.dtype)
    out = self.astype(np.float64) if reduce == "mean" else self.copy()
    touched = np.zeros(self.shape, dtype=bool)
    touched[idx] = True
    if not include_self:           # start touched positions from the reduction's identity
        ident = {"sum": 0, "mean": 0, "prod": 1,
                 "amax": -np.inf if self.dtype.kind == "f" else np.iinfo(self.dtype).min,
                 "amin": np.inf if self.dtype.kind == "f" else np.iinfo(self.dtype).max}[reduce]
        out[touched] = ident
    _UFUNC["sum" if reduce == "mean" else reduce].at(out, idx, vals)
    if reduce == "mean":
        count = np.zeros(self.shape, dtype=np.float64)
        np.add.at(count, idx, 1.0)
        count += 1.0 if include_self else 0.0
        out = np.where(touched, out / np.maximum(count, 1.0), out)
        if self.dtype.kind in "iu":
            return np.floor(out).astype(self.dtype)
    return out.astype(self.dtype)


@define("index_put", "copy", aten=("aten.index_put", "aten.index_put_", "aten._index_put_impl_"))
def index_put(self, indices, values, accumulate=False, unsafe=False):
    """out[indices] = values (or += with accumulate); None in indices keeps a whole dim."""
    out = self.copy()
    idx = tuple(slice(None) if i is None else (i.astype(bool) if i.dtype == np.bool_ else i) for i in indices)
    values = np.asarray(values, dtype=self.dtype)
    if accumulate:
        np.add.at(out, idx, np.broadcast_to(values, out[idx].shape))
    else:
        out[idx] = values
    return out


@define("index_add", "copy", aten=("aten.index_add", "aten.index_add_"))
def index_add(self, dim, index, source, alpha=1):
    out = self.copy()
    if self.ndim == 0:
        return out + (source.reshape(()) * alpha).astype(self.dtype) if index.size else out
    dim = _dim(dim, self.ndim)
    sel = [slice(None)] * self.ndim
    sel[dim] = index
    src = np.asarray(source * alpha if alpha != 1 else source, dtype=self.dtype)
    np.add.at(out, tuple(sel), src.reshape(out[tuple(sel)].shape))
    return out


@define("index_copy", "copy", aten=("aten.index_copy", "aten.index_copy_"))
def index_copy(self, dim, index, source):
    out = self.copy()
    if self.ndim == 0:
        return np.asarray(source, dtype=self.dtype).reshape(()) if index.size else out
    sel = [slice(None)] * self.ndim
    sel[_dim(dim, self.ndim)] = index
    out[tuple(sel)] = source.reshape(out[tuple(sel)].shape)
    return out


@define("index_fill", "copy", aten=("aten.index_fill", "aten.index_fill_"))
def index_fill(self, dim, index, value):
    out = self.copy()
    if self.ndim == 0:
        return np.asarray(value, dtype=self.dtype).reshape(()) if index.size else out
    sel = [slice(None)] * self.ndim
    sel[_dim(dim, self.ndim)] = index
    out[tuple(sel)] = value
    return out


@define("masked_scatter", "copy", aten=("aten.masked_scatter", "aten.masked_scatter_"))
def masked_scatter(self, mask, source):
    """Positions where mask is true take source's elements, in order."""
    shape = np.broadcast_shapes(self.shape, mask.shape)
    out = np.array(np.broadcast_to(self, shape))
    m = np.broadcast_to(mask, shape)
    out[m] = source.reshape(-1)[: int(m.sum())]
    return out


@define("nonzero", "copy", aten=("aten.nonzero",))
def nonzero(self):
    """(count, ndim) int64 coordinates of the non-zero elements, in row-major order."""
    out = np.argwhere(self)           # a 0-d input: (1 or 0, 0), which reshape(-1, 0) cannot say
    return out.astype(np.int64).reshape(out.shape[0], self.ndim)


@define("one_hot", "copy", aten=("aten.one_hot",))
def one_hot(self, num_classes=-1):
    n = int(self.max()) + 1 if num_classes == -1 else num_classes
    return (self[..., None] == np.arange(n)).astype(np.int64)


@define("select_scatter", "copy", aten=("aten.select_scatter",))
def select_scatter(self, src, dim, index):
    """self with self.select(dim, index) replaced by src."""
    out = self.copy()
    sel = [slice(None)] * self.ndim
    sel[_dim(dim, self.ndim)] = index
    out[tuple(sel)] = src
    return out


@define("slice_scatter", "copy", aten=("aten.slice_scatter",))
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    out = self.copy()
    sel = [slice(None)] * self.ndim
    sel[_dim(dim, self.ndim)] = slice(start, end, step)
    out[tuple(sel)] = src
    return out


@define("diagonal_scatter", "copy", aten=("aten.diagonal_scatter",))
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    out = self.copy()
    view = np.diagonal(out, offset, dim1, dim2)       # a read-only view: write through the index arrays
    n = view.shape[-1]
    d1, d2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = np.moveaxis(out, (d1, d2), (-2, -1))
    moved[..., rows, cols] = src
    return out
