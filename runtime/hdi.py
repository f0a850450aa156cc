"""The Hardware Description Interface: the three things a vendor implements.

    ops     OperatorRegistry   which ops (and dtypes) the chip runs, and the kernel for each
    memory  MemoryManager      host<->device copies, allocation, live/peak bytes
    comm    Communicator       collectives, over torch.distributed process groups

A Backend bundles the three with its parsed description and a clock. Everything above the
HDI -- placement, the executor, the profiler, the debugger -- talks to backends through it.

A real compiler stack (ONNX Runtime, OpenVINO, XLA) implements two things instead of per-op kernels,
next to `memory`: claim(node) -> True | reason, and compile(region) -> a program, wrapped by
runtime/stack_registry.StackRegistry as its `ops`; placement groups what it claims into regions
(runtime/backends/onnxruntime_backend.py is the worked example).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .description import Description
from .graph import Node
from .ops import OPS
from .ops.registry import accepts


class OperatorRegistry:
    """Kernels keyed by op name, like `torch.library` registers one implementation per dispatch key.

    `default(node)` builds the kernel for ops the backend's implementation covers generically
    (numpy reference kernels, ATen calls); `register` adds or overrides one op. An op opscope
    does not map (`aten:lstm`, `mylib:fused_rope`) is the default's to take or leave: torch runs
    any ATen or custom op it knows, the numpy kernels only opscope's ops.
    `reference_kernels`: the default kernels are the ops' numpy reference kernels, so an op's
    `accepts(node)` check (the arguments its numpy kernel can take) decides too.
    """

    def __init__(self, default: Callable[[Node], Callable | None], *, supported=None, unsupported=(),
                 dtypes=None, reference_kernels: bool = True):
        self._default = default
        self._kernels: dict[str, tuple[Callable, frozenset | None]] = {}
        self.supported = set(supported) if supported is not None else None
        self.unsupported = set(unsupported)
        self.dtypes = frozenset(dtypes) if dtypes else None
        self.reference_kernels = reference_kernels

    def register(self, op: str, kernel: Callable, dtypes=None) -> None:
        self._kernels[op] = (kernel, frozenset(dtypes) if dtypes else None)

    def supports(self, node: Node) -> bool | str:
        """True, or the reason this backend does not run `node`."""
        if node.op in self.unsupported:
            return f"{node.op} is marked unsupported in the description"
        own = node.op in self._kernels
        if self.supported is not None and node.op not in self.supported and not own:
            return f"{node.op} is not in the description's supported list"
        opdef = None if own else OPS.get(node.op)
        allowed = self._kernels[node.op][1] if own else (opdef.dtypes if opdef is not None else None)
        allowed = allowed & self.dtypes if (allowed and self.dtypes) else allowed
        for m in node.input_meta:
            if allowed and m is not None and m.dtype not in allowed and m.dtype not in ("int64", "bool", "int32"):
                return f"{node.op} has no kernel for {m.dtype}"
        if own:
            return True
        if opdef is not None and self.reference_kernels:
            ok = accepts(node)           # asked first: its answer says why, a missing kernel does not
            if ok is not True:
                return str(ok or f"{node.op}: the reference kernel cannot take these arguments")
        if self._default(node) is None:
            return f"no kernel for {node.op}" if opdef is not None else f"no opscope op for {node.op}"
        return True

    def kernel_for(self, node: Node) -> Callable:
        if node.op in self._kernels:
            return self._kernels[node.op][0]
        return self._default(node)

    def ops(self) -> list[str]:
        """Every op name this registry claims (for conformance and `backends`)."""
        names = set(self._kernels) | {n for n in OPS if self.supported is None or n in self.supported}
        return sorted(names - self.unsupported)


@dataclass
class MemoryStats:
    live_bytes: int = 0
    peak_bytes: int = 0
    allocs: int = 0
    frees: int = 0


# A partial view reaches a backend with its whole storage only while that storage is at most this many times the
# view (or this many elements larger): as_strided over a slice then reads what eager reads, and a parameter that
# is a slice of a large flat buffer is not copied whole once per parameter.
STORAGE_SLACK, STORAGE_SLACK_ELEMENTS = 4, 1 << 16


def keeps_storage(t) -> bool:
    """Whether a host tensor goes to a backend as a view into a copy of its whole storage (same strides and storage
    offset), not as a fresh tensor of its values: a strided view into a larger storage, or at an offset, whose
    elements do not share memory (an expanded tensor arrives as its values: a write to it must not alias)."""
    import torch
    if t.layout != torch.strided or t.is_conj() or t.is_neg():
        return False
    n, size = t.untyped_storage().nbytes() // t.element_size(), t.numel()
    if t.storage_offset() == 0 and n == size and t.is_contiguous():
        return False                   # it is its storage: nothing to keep
    if n > max(STORAGE_SLACK * size, size + STORAGE_SLACK_ELEMENTS):
        return False
    return torch._debug_has_internal_overlap(t) == 0


class MemoryManager:
    """Moves values between the host (numpy arrays) and the device, and counts bytes."""

    def __init__(self):
        self._stats = MemoryStats()

    def to_device(self, host) -> Any:
        raise NotImplementedError

    def to_host(self, buf):
        """A numpy array with the value of `buf`."""
        raise NotImplementedError

    def alloc(self, shape, dtype) -> Any:
        raise NotImplementedError

    def copy(self, dst, src) -> None:
        raise NotImplementedError

    def free(self, buf) -> None:
        self.release(_nbytes(buf))

    def track(self, nbytes: int) -> None:
        s = self._stats
        s.live_bytes += nbytes
        s.allocs += 1
        if s.live_bytes > s.peak_bytes:
            s.peak_bytes = s.live_bytes

    def release(self, nbytes: int) -> None:
        self._stats.live_bytes -= nbytes
        self._stats.frees += 1

    def stats(self) -> MemoryStats:
        return MemoryStats(**vars(self._stats))

    def reset_peak(self) -> None:
        self._stats.peak_bytes = self._stats.live_bytes


def _nbytes(buf) -> int:
    n = getattr(buf, "nbytes", None)
    if n is None and hasattr(buf, "element_size"):
        n = buf.element_size() * buf.numel()
    return int(n or 0)


class HostClock:
    """Host monotonic time; synchronous backends need nothing more."""

    simulated = False

    def start(self, node: Node) -> int:
        return time.perf_counter_ns()

    def stop(self, node: Node, start: int) -> tuple[int, int]:
        return start, time.perf_counter_ns()

    def flush(self) -> None:
        pass


class _LazyComm:
    """`backend.comm`: a Communicator made on first use (a vendor may set its own instead)."""

    def __get__(self, obj, owner=None):
        if obj is None:
            return None                      # the dataclass default
        comm = obj.__dict__.get("_comm")
        if comm is None:
            from .comm import Communicator
            comm = obj.__dict__["_comm"] = Communicator(obj)
        return comm

    def __set__(self, obj, value):
        obj.__dict__["_comm"] = value


@dataclass
class Backend:
    """A registered backend: description + the three HDI modules + a clock."""

    name: str                     # the spec users type: numpy, torch:cpu, sim:npu-a1
    description: Description
    ops: OperatorRegistry
    memory: MemoryManager
    comm: Any = _LazyComm()       # Communicator over torch.distributed, created on first use
    clock: Any = field(default_factory=HostClock)
    device: str = "cpu"
    fallbacks: list = field(default_factory=list)   # Backends for ops this one refuses, tried in order

    @property
    def fallback(self) -> "Backend | None":
        """The first fallback; setting it makes it the only one."""
        return self.fallbacks[0] if self.fallbacks else None

    @fallback.setter
    def fallback(self, backend: "Backend | None") -> None:
        self.fallbacks = [backend] if backend is not None else []

    def fallback_chain(self) -> list["Backend"]:
        """Every backend a refused op may go to, in the order placement tries them: the listed
        fallbacks first, then theirs (breadth first), each once."""
        chain, seen, queue = [], {self.name}, list(self.fallbacks)
        while queue:
            b = queue.pop(0)
            if b.name in seen:
                continue
            seen.add(b.name)
            chain.append(b)
            queue.extend(b.fallbacks)
        return chain

    def synchronize(self) -> None:
        """Wait for queued work; timing hooks call it on asynchronous devices."""

    def prepare(self, node: Node, kernel: Callable) -> Callable:
        """Bind a kernel to a node (device arguments, dtype fixes); called once per plan."""
        return kernel

    @property
    def kind(self) -> str:
        return self.description.kind
