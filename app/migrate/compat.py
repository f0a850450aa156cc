"""The device helpers that code rewritten by `opscope migrate apply` calls instead of torch.cuda.

    from opscope.app.migrate import compat
    model.to(compat.device())            # cuda when there is one, else another accelerator, else cpu
    with compat.autocast(dtype=torch.float16): ...   # bfloat16 on the CPU

The device is chosen once per call from, in order: the OPSCOPE_DEVICE environment variable
(`cpu`, `cuda:1`, `xpu` ...), CUDA, any other accelerator torch knows, the CPU. Every helper
works on every device, so a rewritten script runs unchanged on a machine without a GPU.
Only torch is imported: user scripts must not pay for the rest of opscope.
"""
from __future__ import annotations

import os
import platform

import torch

ENV = "OPSCOPE_DEVICE"
# NOTE: the real query, kept before opscope.app.migrate.auto (runtime mode) makes torch.cuda answer for the chosen device
_cuda_available = torch.cuda.is_available


def _chosen() -> torch.device:
    env = os.environ.get(ENV, "").strip()
    if env:
        return torch.device(env)
    if _cuda_available():
        return torch.device("cuda")
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        found = acc.current_accelerator()
        if found is not None:
            return torch.device(found.type)
    return torch.device("cpu")


def device_type() -> str:
    """"cuda", "xpu", "mps", ... or "cpu"."""
    return _chosen().type


def device(index=None, kind_index=None) -> torch.device:
    """The device to run on, for what the rewritten code held. Only a CUDA-naming value is mapped: None, an int
    (torch's "accelerator number i"), "cuda", "cuda:1", torch.device("cuda", 1) become the chosen device, keeping
    the index; "cpu", "meta", torch.device("xpu") ... come back as they were, so `torch.device(device)` keeps
    meaning what `device` says. `device("cuda", 1)` is `torch.device("cuda", 1)` mapped. On the CPU the index
    is ignored."""
    if kind_index is not None:
        index = torch.device(index, kind_index)
    if isinstance(index, str) and index.partition(":")[0].strip() != "cuda":
        return torch.device(index)
    if isinstance(index, torch.device) and index.type != "cuda":
        return index
    if index is not None and not isinstance(index, (str, torch.device, int)):
        raise TypeError(f"compat.device: expected a device, a device string or an int, got {type(index).__name__}")
    chosen = _chosen()
    if chosen.type == "cpu":
        return chosen
    index = _index_of(index)
    return chosen if index is None else torch.device(chosen.type, index)


def device_string(index=None) -> str:
    """`device(index)` as a string ("cuda:1", "xpu", "cpu"): what a script that kept its device in a string
    variable (`device = "cuda"`, then `"cuda" in device`, `device.split(":")`) still gets after the rewrite."""
    return str(device(index))


def _index_of(index):
    if index is None:
        return None
    if isinstance(index, torch.device):
        return index.index
    if isinstance(index, str):
        _, _, tail = index.partition(":")
        return int(tail) if tail.strip().isdigit() else None
    return int(index)


def is_accelerator(x) -> bool:
    """True when `x` -- a device string or type ("cuda:0", "xpu"), a torch.device, a tensor or a module -- is on
    an accelerator. Replaces `x == "cuda"`, `"cuda" in x`, `x.type == "cuda"` and `x.is_cuda`, which are True
    on CUDA only, so a script's accelerator branch is taken on whichever accelerator runs it."""
    if isinstance(x, torch.Tensor):
        x = x.device
    elif isinstance(x, torch.nn.Module):
        x = next(iter(x.parameters()), torch.empty(0)).device
    kind = x.type if isinstance(x, torch.device) else str(x).partition(":")[0].strip()
    return kind not in ("", "cpu", "meta")


def is_available() -> bool:
    """True when an accelerator (not the CPU) is chosen."""
    return device_type() != "cpu"


def _module():
    """torch.cuda, torch.xpu, ... for the chosen accelerator; None on the CPU."""
    t = device_type()
    return None if t == "cpu" else getattr(torch, t, None)


def device_count() -> int:
    """Accelerators of the chosen type; the CPU counts as one device, so `range(device_count())` loops."""
    mod = _module()
    return mod.device_count() if mod is not None and hasattr(mod, "device_count") else 1


def current_device() -> int:
    mod = _module()
    return mod.current_device() if mod is not None and hasattr(mod, "current_device") else 0


def set_device(index) -> None:
    mod = _module()
    if mod is not None and hasattr(mod, "set_device"):
        mod.set_device(index)


def device_name() -> str:
    mod = _module()
    if mod is not None and hasattr(mod, "get_device_name"):
        return mod.get_device_name()
    return platform.processor() or platform.machine() or "cpu"


def synchronize(device=None) -> None:
    """Wait for queued work on the chosen device (nothing to wait for on the CPU)."""
    mod = _module()
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


# NOTE: CPU tensors are not counted by torch, so on the CPU the memory queries report the
# process's resident memory (and its peak): the closest number that still moves with the model.
def _memory(query: str, on_cpu) -> int:
    mod = _module()
    if mod is not None and hasattr(mod, query):
        return int(getattr(mod, query)())
    return on_cpu()


def memory_allocated(device=None) -> int:
    return _memory("memory_allocated", _rss)


def max_memory_allocated(device=None) -> int:
    return _memory("max_memory_allocated", _peak_rss)


def memory_reserved(device=None) -> int:
    return _memory("memory_reserved", _rss)


def reset_peak_memory_stats(device=None) -> None:
    mod = _module()
    if mod is not None and hasattr(mod, "reset_peak_memory_stats"):
        mod.reset_peak_memory_stats()


def reset_max_memory_allocated(device=None) -> None:
    """torch.cuda.reset_max_memory_allocated: an older name of reset_peak_memory_stats."""
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    mod = _module()
    if mod is not None and hasattr(mod, "empty_cache"):
        mod.empty_cache()


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss()


def _peak_rss() -> int:
    try:
        import resource
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kib) * (1 if platform.system() == "Darwin" else 1024)
    except (ImportError, OSError):
        return 0


def autocast(*args, dtype=None, enabled=True, cache_enabled=None):
    """torch.autocast on the chosen device. Takes both spellings it replaces: `torch.cuda.amp.autocast(enabled,
    dtype)` and `torch.autocast("cuda", dtype)` with the device dropped; float16 becomes bfloat16 on the CPU."""
    for a in args:
        if isinstance(a, bool):
            enabled = a
        elif isinstance(a, torch.dtype):
            dtype = a
    t = device_type()
    if t == "cpu" and dtype in (None, torch.float16):
        dtype = torch.bfloat16
    return torch.autocast(t, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(*args, enabled=True, **kwargs):   # noqa: N802 -- the name of the class it replaces
    """torch.amp.GradScaler, enabled only on CUDA (elsewhere scale() and step() pass through)."""
    return torch.amp.GradScaler("cuda" if device_type() == "cuda" else "cpu", *args,
                                enabled=bool(enabled) and device_type() == "cuda", **kwargs)


def distributed_backend() -> str:
    """The torch.distributed backend for the chosen device, from torch's own map (gloo on the CPU, nccl on CUDA,
    xccl on XPU, what a vendor registered for its device), hccl for Ascend NPUs, else gloo."""
    kind = device_type()
    try:
        import torch.distributed as dist
        known = dict(getattr(dist.Backend, "default_device_backend_map", {}))
    except ImportError:
        known = {}
    known.setdefault("cuda", "nccl")
    known.setdefault("npu", "hccl")
    return known.get(kind, "gloo")


def is_nccl_available() -> bool:
    """torch.distributed.is_nccl_available(), asked of the chosen device: True only where nccl is its backend."""
    import torch.distributed as dist
    return distributed_backend() == "nccl" and dist.is_available() and dist.is_nccl_available()


def profiler_activity():
    """The torch.profiler activity of the chosen accelerator (CUDA, XPU, ...), or CPU when there is none."""
    from torch.profiler import ProfilerActivity
    return getattr(ProfilerActivity, device_type().upper(), ProfilerActivity.CPU)


# ---------------------------------------------------------------- random numbers
# NOTE: torch.cuda's random-number calls touch the CUDA generators and nothing else; code relies on that (Megatron's
# CudaRNGStatesTracker seeds CUDA per tensor-parallel rank and restores only CUDA's state, so the CPU stream stays the
# same on every rank). These keep that meaning: the chosen accelerator's generators, and on the CPU -- where there is
# no accelerator generator -- nothing at all. torch.manual_seed would reseed the CPU stream too and change results.

def manual_seed(seed: int) -> None:
    """torch.cuda.manual_seed(_all): seed the accelerator's generators; the CPU's stream is left alone."""
    mod = _module()
    if mod is not None and hasattr(mod, "manual_seed_all"):
        mod.manual_seed_all(int(seed))


def get_rng_state(device=None) -> torch.Tensor:
    """torch.cuda.get_rng_state: the accelerator generator's state; on the CPU an empty state (no such generator)."""
    mod = _module()
    if mod is not None and hasattr(mod, "get_rng_state"):
        return mod.get_rng_state(_index_of(device) or 0)
    return torch.empty(0, dtype=torch.uint8)


def set_rng_state(state, device=None) -> None:
    """torch.cuda.set_rng_state (and torch._C._cuda_setRNGState): restore the accelerator generator's state; a no-op
    on the CPU, whose own stream a CUDA call never touched."""
    mod = _module()
    if mod is not None and hasattr(mod, "set_rng_state"):
        mod.set_rng_state(state, _index_of(device) or 0)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


class _NoGenerator:
    """torch.cuda.default_generators[i] where there is no accelerator: answers like a generator, changes nothing."""

    def manual_seed(self, seed):
        return self

    def get_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_state(self, state):
        return self

    def seed(self):
        return 0

    def initial_seed(self):
        return 0


def __getattr__(name):
    # default_generators: the accelerator's generators when they are asked for (the device is chosen per call)
    if name == "default_generators":
        mod = _module()
        gens = getattr(mod, "default_generators", None) if mod is not None else None
        return tuple(gens) if gens else (_NoGenerator(),)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- events, streams, device properties
# NOTE: on an accelerator these are its own (torch.xpu.Event, ...); on the CPU work runs when it is called, so an
# event records the host clock and a stream has nothing to order: timing with events measures what it measured.
class Event:
    """torch.cuda.Event for the chosen device: record(), synchronize(), query(), wait(), elapsed_time(end) in ms."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        mod = _module()
        if mod is not None and hasattr(mod, "Event"):
            return mod.Event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        return super().__new__(cls)

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._at = None

    def record(self, stream=None) -> None:
        import time
        self._at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        if not self.enable_timing or not end.enable_timing:
            raise RuntimeError("elapsed_time needs both events created with enable_timing=True")
        if self._at is None or end._at is None:
            raise RuntimeError("elapsed_time: record() both events first")
        return (end._at - self._at) * 1000.0


class Stream:
    """torch.cuda.Stream for the chosen device; on the CPU one stream that is always done."""

    def __new__(cls, device=None, priority=0, **kwargs):
        mod = _module()
        if mod is not None and hasattr(mod, "Stream"):
            return mod.Stream(priority=priority, **kwargs)
        return super().__new__(cls)

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("cpu")
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


_CPU_STREAM = None


def current_stream(device=None):
    global _CPU_STREAM
    mod = _module()
    if mod is not None and hasattr(mod, "current_stream"):
        return mod.current_stream()
    _CPU_STREAM = _CPU_STREAM or Stream()
    return _CPU_STREAM


default_stream = current_stream


def stream(s):
    """`with torch.cuda.stream(s):` on the chosen device."""
    import contextlib
    mod = _module()
    if mod is not None and hasattr(mod, "stream"):
        return mod.stream(s)
    return contextlib.nullcontext(s)


def _meminfo() -> tuple[int, int]:
    """(available, total) bytes of host memory, from /proc/meminfo."""
    found = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return found.get("MemAvailable", found.get("MemFree", 0)), found.get("MemTotal", 0)


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the chosen device; on the CPU, the host's."""
    mod = _module()
    if mod is not None and hasattr(mod, "mem_get_info"):
        return mod.mem_get_info()
    return _meminfo()


def get_device_properties(device=None):
    """The chosen device's properties; on the CPU: name, total_memory, multi_processor_count (cores), major/minor 0."""
    mod = _module()
    if mod is not None and hasattr(mod, "get_device_properties"):
        return mod.get_device_properties(current_device())
    from types import SimpleNamespace
    return SimpleNamespace(name=device_name(), total_memory=_meminfo()[1], multi_processor_count=os.cpu_count() or 1,
                           major=0, minor=0, type="cpu")


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return getattr(p, "major", 0), getattr(p, "minor", 0)


def memory_stats(device=None) -> dict:
    mod = _module()
    if mod is not None and hasattr(mod, "memory_stats"):
        return mod.memory_stats()
    return {"allocated_bytes.all.current": _rss(), "allocated_bytes.all.peak": _peak_rss()}


def memory_summary(device=None, abbreviated=False) -> str:
    mod = _module()
    if mod is not None and hasattr(mod, "memory_summary"):
        return mod.memory_summary()
    return f"{device_type()}: resident {_rss()} bytes, peak {_peak_rss()} bytes"


def max_memory_reserved(device=None) -> int:
    return _memory("max_memory_reserved", _peak_rss)
