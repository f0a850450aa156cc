"""Backend specs -> Backend objects, in one walk read top to bottom:

    1. spec -> Description      NAME[:DEVICE] is what the registry's entry NAME says (runtime/registry.py: numpy,
                                torch:DEVICE, sim:NAME, the stacks, a vendor's package); path/to/chip.toml is a file
    2. Description -> Backend   registry.get(implementation).create(description), or a module named by its path
                                (`implementation = "pkg.module"`, imported only from a trusted description)
    3. fallback chain           each spec in backend.fallback resolved the same way; a loop is refused

Region stacks (onnxruntime[:PROVIDER], openvino[:DEVICE], xla[:PLATFORM], a vendor's) claim regions of the graph
(runtime/regions.py). One that is not installed, or a package that does not load, is listed as not available.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .. import description as _description
from .. import registry
from ..errors import UsageError, first_line
from ..hdi import Backend
from ..home import opscope_home
from . import sim_backend

# what a spec may be lives in runtime/specs.py, which the CLI checks before torch is imported
from ..specs import BUNDLED, description_paths, did_you_mean, specs_help  # noqa: F401  (re-exported)
from ..specs import check_backend_spec, is_file as _is_file


def resolve(spec: str, *, with_fallback: bool = True, trusted: bool | None = None, _seen=()) -> Backend:
    """The backend `spec` names. `trusted`: may a description's `implementation = "pkg.module"` be
    imported? None decides by where the spec came from (see `_may_import`); a caller that read the
    spec from a file someone else wrote (a plan, a shared run) passes False."""
    spec = (spec or "").strip()
    from .. import autoplace
    if autoplace.is_auto(spec):                                       # several backends, chosen per region
        return autoplace.resolve(spec, resolve)
    if spec in _seen:
        raise UsageError(f"backend {spec}: its fallback chain loops ({' -> '.join(_seen + (spec,))})")
    desc, name = describe(spec)                                       # 1. spec -> description
    allowed = trusted is not False and (trusted or _may_import(desc, spec))
    backend = create(desc, name, spec, allowed)                       # 2. description -> backend
    if with_fallback:                                                 # 3. the fallback chain
        _attach_fallbacks(backend, desc, spec, _seen, allowed or (False if trusted is False else None))
    # `--fallback SPEC` reaches placement as specs (runtime/fallback.py); the backend the session resolved
    # carries the resolver, so placement never imports the backends (the runtime's imports stay a DAG)
    backend.resolve_spec = resolve
    return backend


# --- 1. spec -> description ---------------------------------------------------------------
def describe(spec: str):
    """(Description, the backend's name) for a spec; a bad spec is a UsageError naming what exists."""
    base, _, device = spec.partition(":")
    entry = registry.get(base)
    if entry is not None:
        return _described(entry, device, spec)
    if spec.endswith(".toml") or _is_file(spec):
        desc = _description.load(spec)
        return desc, f"sim:{desc.name}" if desc.implementation == "sim" else desc.name
    check_backend_spec(spec)               # raises, saying what exists and what is close
    raise UsageError(f"unknown backend {spec!r}: use {specs_help()} (`opscope backends` lists them)")


# --- 2. description -> backend ------------------------------------------------------------
def _described(entry, device: str, spec: str):
    """What NAME[:DEVICE] means to its entry: its own describe(), else its description file (or a plain one),
    the device going to [backend.options] device."""
    if entry.problem:
        raise UsageError(f"backend {entry.name} is not available: {entry.problem}; `opscope backends` lists what is")
    describe = entry.hook("describe")
    if describe is not None and entry.builtin:
        return describe(device)
    where = entry.hook("description_file")
    if where:
        desc = _description.load(where)
    else:
        # a region stack fuses inside its own compiler (as the built-in stacks' descriptions say): opscope's fused
        # nodes have no ATen target to claim and would split its regions
        regions = entry.kind == "regions"
        desc = _description.Description(name=entry.name, implementation=entry.name, summary=entry.summary,
                                        fallbacks=["numpy"] if regions else [], path="",
                                        passes={"fuse": False} if regions else {})
        desc.options = registry.check_options({}, entry, _refuse(spec))
    if device:
        if "device" not in entry.options:
            raise UsageError(f"backend {spec}: {entry.name} takes no device (it declares no device option); "
                             f"use {entry.name}")
        desc.options = {**desc.options, "device": device}
    return desc, spec


def _refuse(where: str):
    def bad(key, what):
        raise UsageError(f"{where}: {key}: {what}")
    return bad


def create(desc, name: str, spec: str = "", allowed: bool = True) -> Backend:
    entry = registry.get(desc.implementation)
    if entry is not None:                     # a registered backend: opscope's own or an installed package's
        backend = entry.create(desc, name)
        if not isinstance(backend, Backend):
            raise UsageError(f"backend {name}: {entry.target}.create() returned {type(backend).__name__}, "
                             "not an opscope Backend (opscope.runtime.plugin.Backend)")
        return backend
    if not allowed:
        raise UsageError(f"{desc.path}: backend.implementation: {desc.implementation!r} is not imported: a description's module is "
                         "imported only when you name the description on the command line or keep it in "
                         f"{opscope_home() / 'backends'} (this one came from elsewhere, e.g. a plan or a shared run)")
    return _vendor_backend(desc)


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
    rows = []
    for entry in registry.entries().values():
        listing = entry.hook("listing") if entry.builtin else None
        if listing is not None:
            rows += listing()
            continue
        # spec: what -b takes as it is (`opscope ops` resolves it); usage: how the package spells its forms
        row = {"spec": entry.name, "usage": entry.usage, "implementation": entry.name, "kind": entry.kind, "available": False,
               "reason": entry.problem, "summary": entry.summary, "package": entry.dist, "clock": entry.clock,
               "options": {k: v["help"] for k, v in entry.options.items()}}
        if not entry.problem:
            try:
                desc, _ = _described(entry, "", entry.name)
                row["available"], row["reason"] = entry.available(desc)
                row["summary"], row["kind"] = desc.summary or row["summary"], desc.kind
            except UsageError as e:
                row["reason"] = str(e)
        rows.append(row)
    return rows
