"""Runtime migration: run CUDA code you cannot edit on whichever device opscope chose.

    import opscope.app.migrate.auto            # first thing in a script or notebook
    opscope migrate run -- python train.py     # or: an unchanged command, torchrun included

What Ascend's `transfer_to_npu` does for one vendor, for any torch device: calls that name CUDA are
sent to `compat.device()` at the torch API boundary -- `.cuda()`, `device="cuda"` in factories and
`.to()`, `torch.cuda.*` queries, autocast and GradScaler for "cuda", `init_process_group("nccl")`,
`ProfilerActivity.CUDA`, `torch.load(map_location="cuda")`. The script's own strings are left alone,
so `device == "cuda"` and `"cuda" in device` keep the values the script expects, and its CUDA branch
is the one that runs (`torch.cuda.is_available()` answers True: "cuda" now means the chosen device).

On a machine whose chosen device is CUDA itself nothing is patched. Only torch is imported.
"""
from __future__ import annotations

import functools
import os

import torch

from . import compat

_INSTALLED = False
# torch functions that take a `device=` argument
_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
              "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
              "rand_like", "randn_like", "randint_like", "empty_strided", "tril_indices", "triu_indices",
              "scalar_tensor", "normal")


def _is_cuda(d) -> bool:
    """A device that names CUDA: "cuda", "cuda:1", torch.device("cuda"), or an int (torch's accelerator i)."""
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.split(":", 1)[0].strip() == "cuda"
    return isinstance(d, int) and not isinstance(d, bool)


def _device(d):
    """The chosen device for a CUDA device (keeping its index), anything else unchanged."""
    return compat.device(d) if _is_cuda(d) else d


def _scriptable(wrapper, fn):
    """Let TorchScript see the real `fn` where the script calls the wrapper: scripted code resolves a torch
    function through torch.jit's builtin table, and a Python wrapper it does not find there is compiled as
    Python (and fails). Scripted code is thus never redirected -- it runs on the device of its inputs."""
    from torch.jit import _builtins
    op = _builtins._find_builtin(fn)
    if op is not None:
        _builtins._register_builtin(wrapper, op)


def _redirect_kwargs(fn, keys=("device",)):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for k in keys:
            if k in kwargs and _is_cuda(kwargs[k]):
                kwargs[k] = compat.device(kwargs[k])
        return fn(*args, **kwargs)
    wrapper.__opscope_auto__ = True
    _scriptable(wrapper, fn)
    return wrapper


def _patch(owner, name, make) -> None:
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "__opscope_auto__", False):
        return
    new = make(fn)
    new.__opscope_auto__ = True
    setattr(owner, name, new)


def _tensor_to(fn):
    @functools.wraps(fn)
    def to(self, *args, **kwargs):
        args = tuple(_device(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _device(kwargs["device"])
        return fn(self, *args, **kwargs)
    return to


def _module_to(fn):
    @functools.wraps(fn)
    def to(self, *args, **kwargs):       # before torch parses `.to(0)`, which needs an accelerator
        args = tuple(_device(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _device(kwargs["device"])
        return fn(self, *args, **kwargs)
    return to


def _ddp_init(fn):
    @functools.wraps(fn)
    def __init__(self, module, *args, **kwargs):     # noqa: N807 -- the method it stands for
        # NOTE: device_ids / output_device name CUDA devices; DDP refuses them for a CPU module
        if compat.device_type() == "cpu":
            args = tuple(None if i < 2 else a for i, a in enumerate(args))
            for k in ("device_ids", "output_device"):
                if k in kwargs:
                    kwargs[k] = None
        return fn(self, module, *args, **kwargs)
    return __init__


def _tensor_cuda(_fn):
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self.to(compat.device(device), non_blocking=non_blocking, memory_format=memory_format)
    return cuda


def _module_cuda(_fn):
    def cuda(self, device=None):
        return self.to(compat.device(device))
    return cuda


def _pin_memory(fn):
    @functools.wraps(fn)
    def pin_memory(self, *args, **kwargs):
        return fn(self, *args, **kwargs) if compat.is_available() else self   # nothing to pin for on the CPU
    return pin_memory


def _autocast(fn):
    @functools.wraps(fn)
    def autocast(device_type, *args, **kwargs):
        if _is_cuda(device_type):
            return compat.autocast(*args, **kwargs)
        return fn(device_type, *args, **kwargs)
    return autocast


def _grad_scaler(cls):
    def GradScaler(device="cuda", *args, **kwargs):            # noqa: N802 -- the class it stands for
        if _is_cuda(device):
            return compat.GradScaler(*args, **kwargs)
        return cls(device, *args, **kwargs)
    return GradScaler


def _init_process_group(fn):
    @functools.wraps(fn)
    def init_process_group(backend=None, *args, **kwargs):
        if isinstance(backend, str) and "nccl" in backend and compat.distributed_backend() != "nccl":
            backend = compat.distributed_backend()
        return fn(backend, *args, **kwargs)
    return init_process_group


def _profile(cls):
    cuda = torch.profiler.ProfilerActivity.CUDA

    class profile(cls):                                          # noqa: N801 -- the class it stands for
        def __init__(self, *args, activities=None, **kwargs):
            if activities is not None:
                swapped = [compat.profiler_activity() if a == cuda else a for a in activities]
                activities = list(dict.fromkeys(swapped))        # CUDA -> CPU may now repeat CPU
            super().__init__(*args, activities=activities, **kwargs)
    profile.__name__ = profile.__qualname__ = cls.__name__
    return profile


def _load(fn):
    @functools.wraps(fn)
    def load(*args, **kwargs):
        m = kwargs.get("map_location")
        if _is_cuda(m):
            kwargs["map_location"] = compat.device(m)
        elif isinstance(m, dict):
            kwargs["map_location"] = {k: str(_device(v)) for k, v in m.items()}
        return fn(*args, **kwargs)
    return load


def _cuda_module() -> None:
    """torch.cuda's queries answer for the chosen device."""
    c = torch.cuda
    c.is_available = lambda: True
    for name in ("device_count", "current_device", "set_device", "synchronize", "memory_allocated",
                 "max_memory_allocated", "memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "empty_cache"):
        setattr(c, name, getattr(compat, name))
    # random numbers: the accelerator's generators only, as CUDA's calls touch only CUDA's (compat.py says why)
    c.manual_seed = c.manual_seed_all = compat.manual_seed
    for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
        setattr(c, name, getattr(compat, name))
    c.default_generators = compat.default_generators
    c.get_device_name = lambda device=None: compat.device_name()
    c.is_bf16_supported = lambda *a, **k: True
    c.amp.autocast = lambda *a, **k: compat.autocast(*a, **k)
    c.amp.GradScaler = compat.GradScaler
    for name in ("Event", "Stream", "current_stream", "default_stream", "stream", "get_device_properties",
                 "get_device_capability", "mem_get_info", "memory_stats", "memory_summary", "max_memory_reserved"):
        setattr(c, name, getattr(compat, name))


def install() -> bool:
    """Patch torch for the chosen device; False (and nothing patched) when that device is CUDA itself."""
    global _INSTALLED
    if _INSTALLED:
        return True
    if compat.device_type() == "cuda":
        return False
    for name in _FACTORIES:
        _patch(torch, name, _redirect_kwargs)
    _patch(torch.Tensor, "to", _tensor_to)
    _patch(torch.Tensor, "cuda", _tensor_cuda)
    _patch(torch.Tensor, "pin_memory", _pin_memory)
    _patch(torch.nn.Module, "cuda", _module_cuda)
    _patch(torch.nn.Module, "to", _module_to)
    _patch(torch, "autocast", _autocast)
    _patch(torch.amp, "autocast", _autocast)
    _patch(torch.amp, "GradScaler", _grad_scaler)
    _patch(torch, "load", _load)
    _patch(torch.profiler, "profile", _profile)
    import torch.distributed as dist
    if dist.is_available():
        _patch(dist, "init_process_group", _init_process_group)
        from torch.nn.parallel import DistributedDataParallel
        _patch(DistributedDataParallel, "__init__", _ddp_init)
    _cuda_module()
    _INSTALLED = True
    return True


if install() and os.environ.get("OPSCOPE_AUTO_QUIET") != "1":
    import sys
    print(f"opscope: CUDA calls run on {compat.device()} (opscope.app.migrate.auto)", file=sys.stderr)
