"""opscope's own backends, declared the way a vendor's package declares its own (runtime/registry.py) and
registered by the same entry-point group in pyproject.toml. Each declaration is light: the module that
does the work (runtime/backends/*, torch, the stack's package) is imported only by create() and available().

Besides the contract's kind / clock / options / available / create, a built-in may have `describe(device)`
(what `NAME:DEVICE` means), `listing()` (its rows in `opscope backends`) and `check(options, bad)`.
"""
from __future__ import annotations

import importlib

from .errors import UsageError

# [backend.options] of the three compiler stacks (one schema: they take the same four)
STACK_OPTIONS = {
    "device": {"type": str, "help": "the stack's own device name: an execution provider, CPU / GPU.0 / NPU, "
                                    "a PJRT platform"},
    "providers": {"type": list, "help": 'execution providers tried in order, e.g. ["CUDAExecutionProvider", '
                                        '"CPUExecutionProvider"]'},
    "precision": {"type": str, "choices": ["f32", "f16", "bf16"],
                  "help": '"f32" (default: the graph\'s own dtype, never a silent bf16), "f16" or "bf16"'},
    "threads": {"type": int, "help": "intra-op threads (0: the stack decides)"},
}


class _Modules:
    """runtime/backends/NAME.py, imported on first use (torch and the stacks are big)."""

    def __getattr__(self, name: str):
        return importlib.import_module(f"opscope.runtime.backends.{name}")


_MODULES = _Modules()


def _backends():
    return _MODULES


class _Numpy:
    """reference kernels in numpy (float64 available)"""
    kind, clock, options, usage, order = "ops", "host", {}, "numpy", 0
    chip_kernels = True               # a sim:NAME description implemented by it is a described chip
    host_kernels = True               # opscope's kernels on this host's own cores; the spec says all there is

    def describe(self, device: str):
        if device:
            raise UsageError(f"backend numpy:{device}: numpy takes no device; use numpy")
        return _backends().numpy_backend.description(), "numpy"

    def available(self, desc):
        return True, ""

    def create(self, desc):
        return _backends().numpy_backend.create(desc)

    def listing(self) -> list[dict]:
        return [{"spec": "numpy", "implementation": "numpy", "kind": "cpu", "available": True, "reason": "",
                 "summary": self.__doc__}]


class _Torch:
    """ATen kernels on a torch device"""
    kind, clock, options, usage, order = "ops", "device", {}, "torch:cpu, torch:cuda:0", 1
    host_kernels = True

    def describe(self, device: str):
        device = device or "cpu"
        tb = _backends().torch_backend
        ok, why = tb.available(device)
        if not ok:
            raise UsageError(f"backend torch:{device} is not available: {why}; `opscope backends` lists what is")
        return tb.description(device), f"torch:{device}"

    def available(self, desc):
        ok, why = _backends().torch_backend.available(desc.device or "cpu")
        if not ok and desc.path:
            why = f"{desc.name} ({desc.path}) needs torch device {desc.device or 'cpu'}: {why}"
        return ok, why

    def create(self, desc):
        return _backends().torch_backend.create(desc.device or "cpu", desc)

    def listing(self) -> list[dict]:
        rows = []
        for dev in ["cpu", "cuda:0", "mps"]:
            ok, why = _backends().torch_backend.available(dev)
            rows.append({"spec": f"torch:{dev}", "implementation": "torch", "kind": "cpu" if dev == "cpu" else "gpu",
                         "available": ok, "reason": why, "summary": f"ATen kernels on torch device {dev}"})
        return rows


class _Sim:
    """a described chip: numpy kernels on a simulated clock"""
    kind, clock, options, usage, order = "ops", "device", {}, "sim:NAME", 2
    chip_kernels = True

    def describe(self, name: str):
        from . import description
        from .specs import description_paths, did_you_mean
        paths = description_paths()
        if name not in paths:
            raise UsageError(f"unknown sim backend {name!r}: known are {', '.join(sorted(paths)) or 'none'}; "
                             f"or give a path to a .toml description{did_you_mean(name, paths)}")
        desc = description.load(paths[name])
        return desc, chip_name(desc)

    def available(self, desc):
        return True, ""

    def create(self, desc):
        return _backends().sim_backend.create(desc)

    def listing(self) -> list[dict]:
        from . import description, registry
        from .specs import description_paths
        rows = []
        for name, path in description_paths().items():
            row = {"spec": f"sim:{name}", "path": str(path)}
            try:
                d = description.load(path)
                row.update(implementation=d.implementation, kind=d.kind, available=True, reason="", summary=d.summary,
                           unsupported=d.unsupported, fallback=d.fallback, fallbacks=d.fallbacks)
                entry = registry.get(d.implementation)
                if entry is not None and entry.name != "sim":
                    row["available"], row["reason"] = entry.available(d)
            except UsageError as e:
                row.update(available=False, reason=str(e))
            rows.append(row)
        return rows


def chip_name(desc) -> str:
    """A described chip running opscope's own kernels is `sim:NAME`; any other description is its name."""
    from . import registry
    entry = registry.get(desc.implementation)
    return f"sim:{desc.name}" if entry is not None and entry.hook("chip_kernels") else desc.name


class _Stack:
    """A real compiler stack that claims regions (runtime/regions.py); its module is runtime/backends/NAME_backend."""
    kind, clock, options, order = "regions", "host", STACK_OPTIONS, 3

    def __init__(self, name: str):
        self.name = name
        self.usage = name

    @property
    def module(self):
        return importlib.import_module(f"opscope.runtime.backends.{self.name}_backend")

    @property
    def summary(self) -> str:
        return self.default().summary

    def default(self):
        from . import description
        from .specs import BUNDLED
        return description.load(BUNDLED / f"{self.name}.toml")

    def describe(self, device: str):
        desc = self.default()
        if device:
            desc.options = {**desc.options, "device": device}
        return desc, f"{self.name}:{device}" if device else self.name

    def check(self, options: dict, bad) -> None:
        for p in options.get("providers", []):
            if not isinstance(p, str) or not p.strip():
                bad("backend.options.providers", f"expected provider names (strings), got {p!r}")
        if not 0 <= options.get("threads", 0) <= 4096:
            bad("backend.options.threads", f"expected 0 to 4096 threads, got {options['threads']!r}")

    def available(self, desc):
        return self.module.available(desc)

    def create(self, desc):
        return self.module.create(desc, desc.name)

    def listing(self) -> list[dict]:
        desc = self.default()
        ok, why = self.available(desc)
        return [{"spec": self.name, "implementation": self.name, "kind": desc.kind, "available": ok, "reason": why,
                 "summary": desc.summary, "devices": self.module.devices() if ok else [], "path": str(desc.path)}]


numpy, torch, sim = _Numpy(), _Torch(), _Sim()
onnxruntime, openvino, xla = _Stack("onnxruntime"), _Stack("openvino"), _Stack("xla")
