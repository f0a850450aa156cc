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


def device(index=None) -> torch.device:
    """The device to run on. `index` may be what the rewritten code held: an int, a device string ("cuda:1"),
    a torch.device, or None; its accelerator index is kept, its type becomes the chosen one. On the CPU
    the index is ignored."""
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
    """The torch.distributed backend for the chosen device: nccl on CUDA, gloo elsewhere."""
    return "nccl" if device_type() == "cuda" else "gloo"


def profiler_activity():
    """The torch.profiler activity of the chosen accelerator (CUDA, XPU, ...), or CPU when there is none."""
    from torch.profiler import ProfilerActivity
    return getattr(ProfilerActivity, device_type().upper(), ProfilerActivity.CPU)


def manual_seed(seed: int) -> None:
    """Seed every device (torch.manual_seed seeds the accelerators too)."""
    torch.manual_seed(seed)
