"""Backend specs -> Backend objects, in one walk read top to bottom:

    1. spec -> Description      numpy, torch[:DEVICE] and STACK[:DEVICE] are built in; sim:NAME (a bundled
                                description, or one in $OPSCOPE_HOME/backends/) and path/to/chip.toml load a file
    2. Description -> Backend   IMPLEMENTATIONS[implementation].create(description), or a vendor's module
                                (`implementation = "pkg.module"`, imported only from a trusted description)
    3. fallback chain           each spec in backend.fallback resolved the same way; a loop is refused

Stacks (STACKS): onnxruntime[:PROVIDER], openvino[:DEVICE], xla[:PLATFORM] -- real compilers that claim
regions of the graph (runtime/regions.py). One that is not installed is listed as not available.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .. import description as _description
from ..errors import UsageError, first_line
from ..hdi import Backend
from ..home import opscope_home
from . import numpy_backend, sim_backend, torch_backend

# what a spec may be lives in runtime/specs.py, which the CLI checks before torch is imported
from ..specs import BUNDLED, SPECS_HELP, STACKS, description_paths, did_you_mean  # noqa: F401  (re-exported)
from ..specs import check_backend_spec, is_file as _is_file


def resolve(spec: str, *, with_fallback: bool = True, trusted: bool | None = None, _seen=()) -> Backend:
    """The backend `spec` names. `trusted`: may a description's `implementation = "pkg.module"` be
    imported? None decides by where the spec came from (see `_may_import`); a caller that read the
    spec from a file someone else wrote (a plan, a shared run) passes False."""
    spec = (spec or "").strip()
    if spec in _seen:
        raise UsageError(f"backend {spec}: its fallback chain loops ({' -> '.join(_seen + (spec,))})")
    desc, name = describe(spec)                                       # 1. spec -> description
    allowed = trusted is not False and (trusted or _may_import(desc, spec))
    backend = create(desc, name, spec, allowed)                       # 2. description -> backend
    if with_fallback:                                                 # 3. the fallback chain
        _attach_fallbacks(backend, desc, spec, _seen, allowed or (False if trusted is False else None))
    return backend


# --- 1. spec -> description ---------------------------------------------------------------
def describe(spec: str):
    """(Description, the backend's name) for a spec; a bad spec is a UsageError naming what exists."""
    base, _, device = spec.partition(":")
    if spec == "numpy":
        return numpy_backend.description(), "numpy"
    if base == "torch":
        device = device if spec != "torch" else "cpu"
        ok, why = torch_backend.available(device)
        if not ok:
            raise UsageError(f"backend {spec} is not available: {why}; `opscope backends` lists what is")
        return torch_backend.description(device), f"torch:{device}"
    if base in STACKS:
        desc = _description.load(BUNDLED / f"{base}.toml")
        if device:
            desc.options = {**desc.options, "device": device}
        return desc, spec
    if base == "sim":
        paths = description_paths()
        if device not in paths:
            raise UsageError(f"unknown sim backend {device!r}: known are {', '.join(sorted(paths)) or 'none'}; "
                             f"or give a path to a .toml description{did_you_mean(device, paths)}")
        desc = _description.load(paths[device])
        return desc, f"sim:{desc.name}" if desc.implementation in ("sim", "numpy") else desc.name
    if spec.endswith(".toml") or _is_file(spec):
        desc = _description.load(spec)
        return desc, f"sim:{desc.name}" if desc.implementation == "sim" else desc.name
    check_backend_spec(spec)               # raises, saying what exists and what is close
    raise UsageError(f"unknown backend {spec!r}: use {SPECS_HELP} (`opscope backends` lists them)")


# --- 2. description -> backend ------------------------------------------------------------
def create(desc, name: str, spec: str = "", allowed: bool = True) -> Backend:
    impl = desc.implementation
    if impl == "sim":
        return sim_backend.create(desc)
    if impl == "numpy":
        return numpy_backend.create(desc, name=name)
    if impl == "torch":
        device = desc.device or "cpu"
        ok, why = torch_backend.available(device)
        if not ok:
            raise UsageError(f"backend {desc.name} ({desc.path}) needs torch device {device}: {why}")
        return torch_backend.create(device, desc, name=name)
    if impl in STACKS:
        module = stack_module(impl)
        ok, why = module.available(desc)
        if not ok:
            raise UsageError(f"backend {name} is not available: {why}")
        return module.create(desc, name)
    if not allowed:
        raise UsageError(f"{desc.path}: backend.implementation: {impl!r} is not imported: a description's module is "
                         "imported only when you name the description on the command line or keep it in "
                         f"{opscope_home() / 'backends'} (this one came from elsewhere, e.g. a plan or a shared run)")
    return _vendor_backend(desc)


def stack_module(impl: str):
    return importlib.import_module(f".{STACKS[impl]}", __name__)


def _may_import(desc, spec: str) -> bool:
    """A vendor module runs code: only for a description the user chose -- one in their own
    $OPSCOPE_HOME/backends/ (or bundled), or a spec they typed on this process's command line.
    NOTE: a spec read from a plan or a run store is neither, even when the file it names is local."""
    if not desc.path:
        return True
    try:
        where = Path(desc.path).resolve()
    except (OSError, RuntimeError):
        return False
    for folder in (BUNDLED, opscope_home() / "backends"):
        try:
            if where.is_relative_to(folder.resolve()):
                return True
        except OSError:
            continue
    return any(a == spec or (a.startswith("-") and a.partition("=")[2] == spec) for a in sys.argv[1:])


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


# --- 3. the fallback chain ----------------------------------------------------------------
def _attach_fallbacks(backend: Backend, desc, spec: str, seen: tuple, trusted) -> None:
    for i, fb in enumerate(desc.fallbacks):
        try:
            backend.fallbacks.append(resolve(fb, trusted=trusted, _seen=seen + (spec,)))
        except UsageError as e:
            key = "backend.fallback" + (f"[{i}]" if len(desc.fallbacks) > 1 else "")
            raise UsageError(f"{desc.path}: {key}: {e}") from e
    if isinstance(backend.clock, sim_backend.SimClock):
        # Host-timed fallbacks (anywhere down the chain) place their ops on the chip's timeline.
        for fb in backend.fallback_chain():
            if not getattr(fb.clock, "simulated", False) and not isinstance(fb.clock, sim_backend.FollowClock):
                fb.clock = sim_backend.FollowClock(backend.clock, sim_backend.host_description())


# --- the listing ------------------------------------------------------------------------
def list_backends() -> list[dict]:
    """Every registered backend, whether it is available here, and why not."""
    rows = [{"spec": "numpy", "implementation": "numpy", "kind": "cpu", "available": True, "reason": "",
             "summary": "reference kernels in numpy (float64 available)"}]
    for dev in ["cpu", "cuda:0", "mps"]:
        ok, why = torch_backend.available(dev)
        rows.append({"spec": f"torch:{dev}", "implementation": "torch", "kind": "cpu" if dev == "cpu" else "gpu",
                     "available": ok, "reason": why, "summary": f"ATen kernels on torch device {dev}"})
    for stack in STACKS:
        desc = _description.load(BUNDLED / f"{stack}.toml")
        module = stack_module(stack)
        ok, why = module.available(desc)
        rows.append({"spec": stack, "implementation": stack, "kind": desc.kind, "available": ok, "reason": why,
                     "summary": desc.summary, "devices": module.devices() if ok else [],
                     "path": str(desc.path)})
    for name, path in description_paths().items():
        row = {"spec": f"sim:{name}", "path": str(path)}
        try:
            d = _description.load(path)
            row.update(implementation=d.implementation, kind=d.kind, available=True, reason="", summary=d.summary,
                       unsupported=d.unsupported, fallback=d.fallback, fallbacks=d.fallbacks)
            if d.implementation == "torch":
                row["available"], row["reason"] = torch_backend.available(d.device or "cpu")
            elif d.implementation in STACKS:
                row["available"], row["reason"] = stack_module(d.implementation).available(d)
        except UsageError as e:
            row.update(available=False, reason=str(e))
        rows.append(row)
    return rows
