"""numpy: the reference backend. Plain numpy kernels, float64 available for comparisons."""
from __future__ import annotations

import numpy as np
import torch

from ..description import Description
from ..dtypes import round_to_storage, to_numpy
from ..hdi import Backend, MemoryManager, OperatorRegistry, keeps_storage
from ..ops import OPS
from ..ops.registry import accepts

_DEVICE_KW = ("device", "layout", "pin_memory", "memory_format", "non_blocking")


class NumpyMemory(MemoryManager):
    def to_device(self, host):
        if isinstance(host, torch.Tensor):
            t = host.detach().cpu()
            if t.is_conj() or t.is_neg():      # lazily conjugated or negated (an ifft's result): its values
                t = t.resolve_conj().resolve_neg()
            if keeps_storage(t):
                return _with_storage(t)
            if t.dtype == torch.bfloat16:
                t = t.float()
            return t.numpy().copy()
        return np.array(host, copy=True)

    def to_host(self, buf):
        return np.asarray(buf)

    def alloc(self, shape, dtype):
        a = np.empty(shape, dtype=to_numpy(dtype))
        self.track(a.nbytes)
        return a

    def copy(self, dst, src):
        np.copyto(dst, src)


def _with_storage(t: torch.Tensor) -> np.ndarray:
    """A view (same shape, strides and offset) into a copy of `t`'s whole storage: a partial view, a transposed or
    strided input keeps what eager's as_strided reads through it (runtime/ops/shape.py `storage_of`)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    flat = (whole.float() if t.dtype == torch.bfloat16 else whole).numpy().copy()
    item = flat.itemsize
    return np.ndarray(tuple(t.shape), dtype=flat.dtype, buffer=flat, offset=t.storage_offset() * item,
                      strides=tuple(s * item for s in t.stride()))


def numpy_kernel(node, backend):
    """The op's reference kernel, bound to the dtypes capture recorded for its outputs."""
    opdef = OPS.get(node.op)
    if opdef is None:
        return None
    if node.op == "fused":             # one generated function for the whole chain (runtime/passes/fuse.py)
        return _fused_kernel(node, backend)
    if node.attrs.get("layout") == "nhwc":     # NHWC values in and out (runtime/passes/layout.py)
        from ..passes.layout import LayoutCall
        inner = numpy_kernel(_nchw_view(node), backend)
        return LayoutCall(inner, node.attrs["nhwc_args"]) if inner is not None else None
    if accepts(node) is not True:      # the kernel cannot take these arguments: refuse, so the node falls back
        return None
    fn = opdef.numpy
    if fn is None:
        if opdef.composite is None:
            return None
        from ..decompose import decomposed_kernel
        return decomposed_kernel(node, backend)
    want = [to_numpy(m.dtype) if m is not None else None for m in node.output_meta]
    # bfloat16 lives in float32 arrays: every result is rounded to it, as a chip storing bfloat16 would
    storage = [m.dtype if m is not None else None for m in node.output_meta]
    inplace = str(getattr(node.target, "overloadpacket", "")).endswith("_")
    if node.multi_output:
        def run_multi(*args, **kwargs):
            return [round_to_storage(np.asarray(o).astype(w, copy=False), d) if w is not None else o
                    for o, w, d in zip(fn(*args, **kwargs), want, storage)]
        return run_multi
    w, d = want[0], storage[0]

    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        if w is not None:
            out = np.asarray(out)
            if out.dtype != w:
                out = out.astype(w)
            out = round_to_storage(out, d)
        if inplace and isinstance(args[0], np.ndarray) and args[0].flags.writeable and args[0].shape == out.shape:
            np.copyto(args[0], out)   # ATen in-place ops mutate their first argument
            return args[0]
        return out

    return run


def _fused_kernel(node, backend):
    from ..passes.codegen import fused_numpy_kernel
    from ..passes.fuse import members
    kernels = {}
    for m in members(node):
        k = numpy_kernel(m, backend)
        if k is None:
            return None
        kernels[id(m)] = backend.prepare(m, k)
    return fused_numpy_kernel(node, lambda m: kernels[id(m)])


def _nchw_view(node):
    """The node as capture saw it (NCHW metadata), for choosing and checking its reference kernel."""
    import copy

    from ..passes.layout import TO_NCHW
    n = copy.copy(node)
    n.attrs = {k: v for k, v in node.attrs.items() if k not in ("layout", "nhwc_args")}
    perm = lambda m: type(m)(tuple(m.shape[d] for d in TO_NCHW), m.dtype) if m is not None and len(m.shape) == 4 else m  # noqa: E731
    nhwc_slots = {node.args[i].slot for i in node.attrs["nhwc_args"]}
    n.input_meta = [perm(m) if s in nhwc_slots else m for s, m in zip(node.inputs, node.input_meta)]
    n.output_meta = [perm(m) for m in node.output_meta]
    return n


class NumpyBackend(Backend):
    def prepare(self, node, kernel):
        if any(k in node.kwargs for k in _DEVICE_KW):
            drop = {k for k in _DEVICE_KW if k in node.kwargs}

            def no_device(*args, **kwargs):
                return kernel(*args, **{k: v for k, v in kwargs.items() if k not in drop})
            return no_device
        return kernel


def description() -> Description:
    """What the built-in spec `numpy` means."""
    return Description(name="numpy", implementation="numpy", kind="cpu",
                       summary="reference kernels in numpy (float64 available)")


def create(desc: Description | None = None, name: str = "numpy") -> NumpyBackend:
    desc = desc or description()
    backend = NumpyBackend(name=name, description=desc, ops=None, memory=NumpyMemory(), device="cpu")
    backend.ops = OperatorRegistry(lambda node: numpy_kernel(node, backend), supported=desc.supported,
                                   unsupported=desc.unsupported)
    return backend
