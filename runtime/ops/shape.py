"""Views, indexing, joining, creation and type conversion: numpy reference kernels."""
from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy
from .registry import define


def _dim(d, ndim):
    return d + ndim if d < 0 else d


# --- views -------------------------------------------------------------------------------
@define("view", "view", aten=("aten.view", "aten.reshape", "aten._unsafe_view", "aten.view_as", "aten.reshape_as"))
def view(self, size):
    if not isinstance(size, (list, tuple)):   # view_as / reshape_as pass a tensor
        size = size.shape
    return np.reshape(self, tuple(size))


@define("permute", "view", aten=("aten.permute",))
def permute(self, dims):
    return np.transpose(self, dims)


@define("transpose", "view", aten=("aten.transpose", "aten.swapaxes"))
def transpose(self, dim0, dim1):
    return np.swapaxes(self, dim0, dim1)


@define("t", "view", aten=("aten.t", "aten.numpy_T"))
def t(self):
    return self.T


@define("expand", "view", aten=("aten.expand", "aten.expand_as"))
def expand(self, size, implicit=False):
    if not isinstance(size, (list, tuple)):
        size = size.shape
    lead = len(size) - self.ndim
    shape = tuple(s if s != -1 else self.shape[i - lead] for i, s in enumerate(size))
    return np.broadcast_to(self, shape)


@define("slice", "view", aten=("aten.slice",))
def slice_(self, dim=0, start=None, end=None, step=1):
    idx = [slice(None)] * self.ndim
    idx[dim] = slice(start, end, step)
    return self[tuple(idx)]


@define("narrow", "view", aten=("aten.narrow",))
def narrow(self, dim, start, length):
    return slice_(self, dim, start, start + length)


@define("select", "view", aten=("aten.select",))
def select(self, dim, index):
    idx = [slice(None)] * self.ndim
    idx[dim] = index
    return self[tuple(idx)]


@define("unsqueeze", "view", aten=("aten.unsqueeze", "aten.unsqueeze_"))
def unsqueeze(self, dim):
    return np.expand_dims(self, _dim(dim, self.ndim + 1))


@define("squeeze", "view", aten=("aten.squeeze", "aten.squeeze_"))
def squeeze(self, dim=None):
    if dim is None:
        return np.squeeze(self)
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    dims = tuple(_dim(d, self.ndim) for d in dims if self.shape[_dim(d, self.ndim)] == 1)
    return np.squeeze(self, axis=dims) if dims else self


@define("flatten", "view", aten=("aten.flatten",))
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    s, e = _dim(start_dim, self.ndim), _dim(end_dim, self.ndim)
    return self.reshape(self.shape[:s] + (-1,) + self.shape[e + 1:])


@define("unflatten", "view", aten=("aten.unflatten",))
def unflatten(self, dim, sizes):
    d = _dim(dim, self.ndim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])


@define("diagonal", "view", aten=("aten.diagonal",))
def diagonal(self, offset=0, dim1=0, dim2=1):
    return np.diagonal(self, offset, dim1, dim2)


def storage_of(a: np.ndarray) -> tuple[np.ndarray, int]:
    """The flat array `a` views (torch's storage) and `a`'s element offset into it (its storage_offset).

    A view of a graph input or of another kernel's output lies in that array's memory, as it would in torch's
    storage; an array that owns its memory is its own storage when row-major, else (no storage order to follow)
    its values in row-major order."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is a or not root.flags.c_contiguous or root.dtype != a.dtype:
        return np.ascontiguousarray(a).reshape(-1), 0
    start = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    if start % a.itemsize:
        return np.ascontiguousarray(a).reshape(-1), 0
    return root.reshape(-1), start // a.itemsize


@define("as_strided", "view", aten=("aten.as_strided", "aten.as_strided_"))
def as_strided(self, size, stride, storage_offset=None):
    """A view with explicit strides over self's storage (runtime/ops/shape.py `storage_of`), from
    `storage_offset` (absolute, as in torch) or else from where self starts in it."""
    storage, own = storage_of(self)
    start = own if storage_offset is None else int(storage_offset)
    last = start + sum((n - 1) * s for n, s in zip(size, stride)) if all(n > 0 for n in size) else start - 1
    if start < 0 or last >= storage.size:
        raise ValueError(f"as_strided: size {list(size)}, stride {list(stride)} and storage offset {start} reach "
                         f"element {last}, beyond a storage of {storage.size}")
    item = storage.itemsize
    return np.lib.stride_tricks.as_strided(storage[start:], tuple(size), tuple(s * item for s in stride),
                                           writeable=False).copy()


@define("alias", "view", aten=("aten.alias", "aten.detach", "aten.detach_", "aten.lift_fresh", "aten.view_as_real"))
def alias(self):
    return self


@define("contiguous", "copy", aten=("aten.contiguous", "aten.clone", "aten.lift_fresh_copy"))
def contiguous(self, memory_format=None):
    return np.array(self, copy=True, order="C")


@define("unbind", "view", aten=("aten.unbind",))
def unbind(self, dim=0):
    return [np.take(self, i, axis=dim) for i in range(self.shape[dim])]


@define("split", "view", aten=("aten.split", "aten.split_with_sizes"))
def split(self, split_size, dim=0):
    n = self.shape[dim]
    if isinstance(split_size, (list, tuple)):
        cuts = np.cumsum(split_size)[:-1]
    else:
        cuts = list(range(split_size, n, split_size))
    return np.split(self, cuts, axis=dim)


@define("chunk", "view", aten=("aten.chunk",))
def chunk(self, chunks, dim=0):
    n = self.shape[dim]
    size = -(-n // chunks)
    return split(self, size, dim)


@define("copy", "copy", aten=("aten.copy", "aten.copy_"))
def copy(self, src, non_blocking=False):
    """self's shape and dtype, src's values (broadcast)."""
    return np.array(np.broadcast_to(src, self.shape), dtype=self.dtype)


@define("resize", "copy", aten=("aten.resize", "aten.resize_"))
def resize(self, size, memory_format=None):
    """The first prod(size) elements of self in its contiguous order; elements past self's end are
    zeros here, where ATen leaves them uninitialized (so conformance samples only shrink or keep)."""
    n = int(np.prod(size, dtype=np.int64))
    flat = np.ascontiguousarray(self).reshape(-1)[:n]
    if flat.size < n:
        flat = np.concatenate([flat, np.zeros(n - flat.size, dtype=self.dtype)])
    return flat.reshape(tuple(size))


@define("fill", "copy", aten=("aten.fill", "aten.fill_"))
def fill(self, value):
    return np.full(self.shape, np.asarray(value).reshape(()), dtype=self.dtype)


# --- sizes and scalars: what dynamic shapes and .item() capture to (Python numbers out) ----
def _strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return out[::-1]


@define("sym_size", "view", aten=("aten.sym_size",), flops=lambda n: 0)
def sym_size(self, dim=None):
    return self.shape[dim] if dim is not None else list(self.shape)


@define("sym_numel", "view", aten=("aten.sym_numel",), flops=lambda n: 0)
def sym_numel(self):
    return int(self.size)


@define("sym_stride", "view", aten=("aten.sym_stride",), flops=lambda n: 0)
def sym_stride(self, dim=None):
    """Strides of the contiguous layout the numpy backend keeps values in."""
    strides = _strides(self.shape)
    return strides[dim] if dim is not None else strides


@define("sym_is_contiguous", "view", aten=("aten.sym_is_contiguous",), flops=lambda n: 0)
def sym_is_contiguous(self, memory_format=None):
    """The numpy backend keeps every value contiguous."""
    return True


@define("sym_storage_offset", "view", aten=("aten.sym_storage_offset",), flops=lambda n: 0)
def sym_storage_offset(self):
    return 0


@define("item", "copy", aten=("aten._local_scalar_dense", "aten.item"), flops=lambda n: 0)
def item(self):
    return self.item()


# --- joining and indexing ----------------------------------------------------------------
@define("cat", "copy", aten=("aten.cat", "aten.concat", "aten.concatenate"))
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    return np.concatenate(tensors, axis=dim)


@define("stack", "copy", aten=("aten.stack",))
def stack(tensors, dim=0):
    return np.stack(tensors, axis=dim)


@define("repeat", "copy", aten=("aten.repeat",))
def repeat(self, repeats):
    lead = len(repeats) - self.ndim
    return np.tile(self.reshape((1,) * lead + self.shape), repeats)


@define("index", "copy", aten=("aten.index",))
def index(self, indices):
    idx = tuple(slice(None) if i is None else i for i in indices)
    return self[idx]


@define("index_select", "copy", aten=("aten.index_select",))
def index_select(self, dim, index):
    if self.ndim == 0:              # torch: a 0-d tensor indexed by [0] is itself
        return np.array(self)
    return np.take(self, index, axis=dim)


@define("gather", "copy", aten=("aten.gather",))
def gather(self, dim, index, sparse_grad=False):
    return np.take_along_axis(self, index, axis=dim)


@define("tril", "copy", aten=("aten.tril",))
def tril(self, diagonal=0):
    return np.tril(self, diagonal)


@define("triu", "copy", aten=("aten.triu",))
def triu(self, diagonal=0):
    return np.triu(self, diagonal)


@define("flip", "copy", aten=("aten.flip",))
def flip(self, dims):
    return np.flip(self, axis=tuple(dims))


@define("roll", "copy", aten=("aten.roll",))
def roll(self, shifts, dims=()):
    return np.roll(self, shifts, axis=tuple(dims) if dims else None)


@define("diff", "elementwise", aten=("aten.diff",))
def diff(self, n=1, dim=-1, prepend=None, append=None):
    kw = {}
    if prepend is not None:
        kw["prepend"] = prepend
    if append is not None:
        kw["append"] = append
    return np.diff(self, n=n, axis=dim, **kw)


@define("pad", "copy", aten=("aten.constant_pad_nd", "aten.pad"))
def pad(self, pad, value=0.0, *rest):
    mode = "constant"
    if isinstance(value, str):       # aten.pad(self, pad, mode, value)
        mode, value = value, (rest[0] if rest else 0.0)
    return pad_nd(self, pad, mode, value)


@define("reflection_pad", "copy", aten=("aten.reflection_pad1d", "aten.reflection_pad2d", "aten.reflection_pad3d"))
def reflection_pad(self, padding):
    return pad_nd(self, padding, "reflect")


@define("replication_pad", "copy", aten=("aten.replication_pad1d", "aten.replication_pad2d",
                                         "aten.replication_pad3d"))
def replication_pad(self, padding):
    return pad_nd(self, padding, "replicate")


def pad_nd(self, pad, mode="constant", value=0.0):
    """torch's pad list (last dim first, (before, after) pairs); a negative width crops."""
    if mode == "replicate":     # out[i] = x[clamp(i - before)]: also right when a crop empties a side
        out = self
        for i in range(len(pad) // 2):
            d = self.ndim - 1 - i
            lo, hi = pad[2 * i], pad[2 * i + 1]
            src = np.clip(np.arange(self.shape[d] + lo + hi) - lo, 0, self.shape[d] - 1)
            out = np.take(out, src, axis=d)
        return out
    widths = [(0, 0)] * self.ndim
    crop = [slice(None)] * self.ndim
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        widths[d] = (max(lo, 0), max(hi, 0))
        crop[d] = slice(-min(lo, 0), self.shape[d] + min(hi, 0))
    x = self[tuple(crop)]             # numpy cannot take negative widths: crop first, then pad
    if mode == "constant":
        return np.pad(x, widths, constant_values=value or 0)
    return np.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


# --- creation ----------------------------------------------------------------------------
def _dtype(dtype, default="float32"):
    return to_numpy(dtype) if dtype is not None else np.dtype(default)


@define("arange", "creation", aten=("aten.arange",))
def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if end is None:
        start, end = 0, start
    is_float = any(isinstance(v, float) for v in (start, end, step))
    return np.arange(start, end, step, dtype=_dtype(dtype, "float32" if is_float else "int64"))


@define("full", "creation", aten=("aten.full",))
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    default = "bool" if isinstance(fill_value, bool) else "int64" if isinstance(fill_value, int) else "float32"
    return np.full(tuple(size), fill_value, dtype=_dtype(dtype, default))


@define("zeros", "creation", aten=("aten.zeros", "aten.empty", "aten.empty_strided"))
def zeros(size, *rest, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return np.zeros(tuple(size), dtype=_dtype(dtype))


@define("ones", "creation", aten=("aten.ones",))
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return np.ones(tuple(size), dtype=_dtype(dtype))


@define("full_like", "creation", aten=("aten.full_like",))
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return np.full(self.shape, fill_value, dtype=_dtype(dtype, self.dtype.name))


@define("zeros_like", "creation", aten=("aten.zeros_like", "aten.empty_like"))
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return np.zeros(self.shape, dtype=_dtype(dtype, self.dtype.name))


@define("ones_like", "creation", aten=("aten.ones_like",))
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return np.ones(self.shape, dtype=_dtype(dtype, self.dtype.name))


@define("new_full", "creation", aten=("aten.new_full",))
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return np.full(tuple(size), fill_value, dtype=_dtype(dtype, self.dtype.name))


@define("new_zeros", "creation", aten=("aten.new_zeros", "aten.new_empty"))
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return np.zeros(tuple(size), dtype=_dtype(dtype, self.dtype.name))


@define("new_ones", "creation", aten=("aten.new_ones",))
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return np.ones(tuple(size), dtype=_dtype(dtype, self.dtype.name))


@define("scalar_tensor", "creation", aten=("aten.scalar_tensor",))
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return np.asarray(s, dtype=_dtype(dtype))


# --- type conversion ---------------------------------------------------------------------
@define("to", "copy", aten=("aten.to", "aten._to_copy", "aten.type_as"))
def to(self, *args, dtype=None, **kw):
    for a in args:                       # to.dtype(self, dtype, ...), type_as(self, other)
        if isinstance(a, np.ndarray):
            dtype = a.dtype
            break
        if a is not None and not isinstance(a, (bool, str)) and dtype is None:
            try:
                dtype = to_numpy(a)
                break
            except (KeyError, TypeError):
                continue
    return self.astype(to_numpy(dtype)) if dtype is not None else self
