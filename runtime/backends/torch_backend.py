"""torch:<device>: runs each node's own ATen kernel on any torch device (cpu, cuda:0, mps...)."""
from __future__ import annotations

import numpy as np
import torch

from ..description import Description, device_problem
from ..dtypes import to_torch
from ..hdi import Backend, HostClock, MemoryManager, MemoryStats, OperatorRegistry, keeps_storage
from ..ops import OPS


class TorchMemory(MemoryManager):
    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def to_device(self, host):
        if isinstance(host, torch.Tensor):
            t = host.detach()
            if keeps_storage(t):
                # a partial view: its whole storage goes over, so as_strided reads what it reads in eager
                n = t.untyped_storage().nbytes() // t.element_size()
                whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
                whole = whole.to(self.device, copy=True)
                out = torch.empty(0, dtype=t.dtype, device=self.device).set_(
                    whole.untyped_storage(), t.storage_offset(), t.size(), t.stride())
                return out
            return t.to(self.device, copy=True)
        a = np.asarray(host)        # NOTE: not ascontiguousarray alone: it makes a 0-d value 1-d
        return torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape)).to(self.device)

    def to_host(self, buf):
        if not isinstance(buf, torch.Tensor):
            return np.asarray(buf)
        t = buf.detach()
        if t.layout != torch.strided:            # sparse results (to_sparse) as the dense values they hold
            t = t.to_dense()
        t = t.resolve_conj().resolve_neg()       # numpy() refuses a lazily conjugated view (fft.ifft's result)
        if t.dtype == torch.bfloat16:
            t = t.float()
        elif t.dtype == torch.complex32:         # numpy has no complex32: the same values, wider
            t = t.to(torch.complex64)
        return t.cpu().numpy()

    def alloc(self, shape, dtype):
        t = torch.empty(tuple(shape), dtype=to_torch(dtype), device=self.device)
        self.track(t.element_size() * t.numel())
        return t

    def copy(self, dst, src):
        dst.copy_(src)

    def stats(self) -> MemoryStats:
        if self.device.type == "cuda":   # the caching allocator knows better than our accounting
            return MemoryStats(torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device),
                               self._stats.allocs, self._stats.frees)
        return super().stats()


class CudaEventClock(HostClock):
    """Device time from CUDA events, resolved at flush (one synchronize per step, not per op)."""

    def __init__(self, device):
        self.device = device
        self._pending = []

    def start(self, node):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, node, start):
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return PendingTiming(start, end)

    def flush(self):
        torch.cuda.synchronize(self.device)


class PendingTiming:
    """A (start, end) pair of CUDA events; `resolve(anchor_event, anchor_ns)` gives ns times."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        self.start, self.end = start, end

    def resolve(self, anchor_event, anchor_ns: int) -> tuple[int, int]:
        s = anchor_ns + int(anchor_event.elapsed_time(self.start) * 1e6)
        e = anchor_ns + int(anchor_event.elapsed_time(self.end) * 1e6)
        return s, e


class TorchBackend(Backend):
    def synchronize(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(torch.device(self.device))

    def prepare(self, node, kernel):
        if "device" in node.kwargs:        # creation ops were captured with the capture device
            dev = torch.device(self.device)

            def on_device(*args, **kwargs):
                kwargs["device"] = dev
                return kernel(*args, **kwargs)
            return on_device
        return kernel


def _aten_kernel(node):
    """The node's own overload: opscope's ops, and any ATen or custom op torch has a kernel for."""
    target = node.target
    if target is None:
        return None
    if node.op == "native_dropout":
        return _seeded_dropout
    if node.op in OPS or isinstance(target, torch._ops.OpOverload):
        return target
    return None


def _seeded_dropout(input, p, train=True):
    """Dropout by opscope's rule (ops/backward.seeded_keep), not torch's generator: a training run on torch
    repeats exactly and compares with eager by value, as on numpy and the sim chips."""
    from ..ops.backward import seeded_keep
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = torch.from_numpy(seeded_keep(input.shape, p)).to(input.device)
    return (input * keep * (1.0 / (1.0 - p)) if p < 1 else torch.zeros_like(input)), keep


def available(device: str) -> tuple[bool, str]:
    if why := device_problem(device):
        return False, why
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False on this machine"
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        return False, f"only {torch.cuda.device_count()} CUDA device(s) here"
    module = getattr(torch, dev.type, None) if dev.type != "cpu" else None
    is_available = getattr(module, "is_available", None)
    if callable(is_available) and not is_available():       # mps, xpu, mtia, a vendor's npu ...
        return False, f"torch.{dev.type}.is_available() is False on this machine"
    return True, ""


def description(device: str = "cpu") -> Description:
    """What the built-in spec `torch:DEVICE` means."""
    kind = "gpu" if torch.device(device).type in ("cuda", "mps", "xpu") else "cpu"
    return Description(name=f"torch:{device}", implementation="torch", device=device, kind=kind,
                       summary=f"ATen kernels on torch device {device}")


def create(device: str = "cpu", desc: Description | None = None, name: str | None = None) -> TorchBackend:
    dev = torch.device(device)
    name = name or f"torch:{device}"
    desc = desc or description(device)
    clock = CudaEventClock(dev) if dev.type == "cuda" else HostClock()
    backend = TorchBackend(name=name, description=desc, ops=None, memory=TorchMemory(dev), device=str(dev), clock=clock)
    # Every captured node carries its ATen overload, so ATen ops run natively; ops captured
    # without an opscope mapping (aten:lstm, a library's custom op) run too -- torch knows them.
    backend.ops = OperatorRegistry(_aten_kernel, supported=desc.supported, unsupported=desc.unsupported,
                                   reference_kernels=False)
    return backend
