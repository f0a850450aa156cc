"""Backend specs -> Backend objects, and the list of everything registered.

    numpy                  the reference backend
    torch:<device>         torch:cpu, torch:cuda:0, torch:mps ...
    sim:<name>             a bundled description, or one in $OPSCOPE_HOME/backends/
    path/to/chip.toml      a description file
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .. import description as _description
from ..errors import UsageError, first_line
from ..hdi import Backend
from ..home import opscope_home
from . import numpy_backend, sim_backend, torch_backend

BUNDLED = Path(__file__).resolve().parent.parent / "descriptions"


def description_paths() -> dict[str, Path]:
    """name -> description file: bundled first, then the user's own (which may override)."""
    found = {}
    for folder in (BUNDLED, opscope_home() / "backends"):
        if folder.is_dir():
            for p in sorted(folder.glob("*.toml")):
                found[p.stem] = p
    return found


def resolve(spec: str, *, with_fallback: bool = True, _seen=()) -> Backend:
    spec = (spec or "").strip()
    if spec in _seen:
        raise UsageError(f"backend {spec}: its fallback chain loops ({' -> '.join(_seen + (spec,))})")
    if spec == "numpy":
        return numpy_backend.create()
    if spec == "torch" or spec.startswith("torch:"):
        device = spec.split(":", 1)[1] if ":" in spec else "cpu"
        ok, why = torch_backend.available(device)
        if not ok:
            raise UsageError(f"backend {spec} is not available: {why}; `opscope backends` lists what is")
        return torch_backend.create(device)
    if spec.startswith("sim:"):
        name = spec[4:]
        paths = description_paths()
        if name not in paths:
            raise UsageError(f"unknown sim backend {name!r}: known are {', '.join(sorted(paths)) or 'none'}; "
                             "or give a path to a .toml description")
        return from_description(_description.load(paths[name]), spec, with_fallback, _seen)
    if spec.endswith(".toml") or _is_file(spec):
        return from_description(_description.load(spec), spec, with_fallback, _seen)
    raise UsageError(f"unknown backend {spec!r}: use numpy, torch:cpu, torch:cuda:0, sim:NAME or a path to a "
                     ".toml description (`opscope backends` lists them)")


def _is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):          # a name too long for the file system, a NUL byte: not a file
        return False


def from_description(desc, spec: str, with_fallback: bool = True, _seen=()):
    impl = desc.implementation
    if impl == "sim":
        backend = sim_backend.create(desc)
    elif impl == "numpy":
        backend = numpy_backend.create(desc, name=f"sim:{desc.name}" if spec.startswith("sim:") else desc.name)
    elif impl == "torch":
        device = desc.device or "cpu"
        ok, why = torch_backend.available(device)
        if not ok:
            raise UsageError(f"backend {desc.name} ({desc.path}) needs torch device {device}: {why}")
        backend = torch_backend.create(device, desc, name=desc.name)
    else:
        backend = _vendor_backend(desc)
    if with_fallback:
        for i, fb in enumerate(desc.fallbacks):
            try:
                backend.fallbacks.append(resolve(fb, _seen=_seen + (spec,)))
            except UsageError as e:
                key = "backend.fallback" + (f"[{i}]" if len(desc.fallbacks) > 1 else "")
                raise UsageError(f"{desc.path}: {key}: {e}") from e
        if isinstance(backend.clock, sim_backend.SimClock):
            # Host-timed fallbacks (anywhere down the chain) place their ops on the chip's timeline.
            for fb in backend.fallback_chain():
                if not getattr(fb.clock, "simulated", False) and not isinstance(fb.clock, sim_backend.FollowClock):
                    fb.clock = sim_backend.FollowClock(backend.clock)
    return backend


def _vendor_backend(desc):
    """implementation = "vendor.module": the module's create(description) builds the backend."""
    where = f"{desc.path}: backend.implementation"
    try:
        module = importlib.import_module(desc.implementation)
    except Exception as e:       # a vendor module may raise anything while importing
        raise UsageError(f"{where}: cannot import {desc.implementation!r} ({type(e).__name__}: {first_line(e)})")
    if not callable(getattr(module, "create", None)):
        raise UsageError(f"{where}: module {desc.implementation!r} has no create(description)")
    try:
        backend = module.create(desc)
    except Exception as e:
        raise UsageError(f"{where}: {desc.implementation}.create() failed ({type(e).__name__}: {first_line(e)})")
    if not isinstance(backend, Backend):
        raise UsageError(f"{where}: {desc.implementation}.create() returned {type(backend).__name__}, not a Backend")
    return backend


def list_backends() -> list[dict]:
    """Every registered backend, whether it is available here, and why not."""
    rows = [{"spec": "numpy", "implementation": "numpy", "kind": "cpu", "available": True, "reason": "",
             "summary": "reference kernels in numpy (float64 available)"}]
    devices = ["cpu", "cuda:0", "mps"]
    for dev in devices:
        ok, why = torch_backend.available(dev)
        rows.append({"spec": f"torch:{dev}", "implementation": "torch", "kind": "cpu" if dev == "cpu" else "gpu",
                     "available": ok, "reason": why, "summary": f"ATen kernels on torch device {dev}"})
    for name, path in description_paths().items():
        row = {"spec": f"sim:{name}", "path": str(path)}
        try:
            d = _description.load(path)
            row.update(implementation=d.implementation, kind=d.kind, available=True, reason="", summary=d.summary,
                       unsupported=d.unsupported, fallback=d.fallback, fallbacks=d.fallbacks)
            if d.implementation == "torch":
                row["available"], row["reason"] = torch_backend.available(d.device or "cpu")
        except UsageError as e:
            row.update(available=False, reason=str(e))
        rows.append(row)
    return rows
