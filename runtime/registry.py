"""The backend registry: every backend -- opscope's own and a vendor's package -- found by one entry-point group.

    [project.entry-points."opscope.backends"]          # in the vendor's pyproject.toml
    acme = "acme_opscope.stack"                        # a module (or any object) that declares:

    kind = "regions"        # "ops": a kernel per op (numpy, torch, sim) | "regions": it claims and compiles regions
    clock = "host"          # "host": opscope times its calls on the host | "device": its own device clock
    options = {"workspace": {"type": int, "default": 0, "help": "scratch bytes"}, ...}   # [backend.options]
    def available(description) -> tuple[bool, str]     # (False, why) when it cannot run here
    def create(description) -> Backend                  # opscope names the backend after the spec it was given

Optional: `description_file` (the .toml the bare spec `acme` means; else a plain one: fallback numpy for a region
stack), `summary` (one line for `opscope backends`; else the docstring's first), `usage` (how -b spells it).
A `device` option makes `acme:DEVICE` a spec. Keep the module light: import the SDK inside create().
`opscope backends` lists every entry; one that fails to import, lacks a function or declares a bad schema is
"not available: <reason>" and nothing else notices. Nothing outside this module lists backend names: the
CLI, descriptions, plans, the profiler and the OpInfo worker ask it (tests/test_registry.py checks).
NOTE: light on purpose (no torch): the profiler and the CLI's argument checks read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from typing import Any

from .errors import UsageError, first_line

GROUP = "opscope.backends"
KINDS = {"ops": "a kernel per op", "regions": "claims and compiles regions of the graph"}
CLOCKS = {"host": "opscope times its calls on the host", "device": "its own device clock"}
OPTION_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list}
OPTION_KEYS = ("type", "choices", "default", "help")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
OWN = "opscope"                      # the distribution whose entries are the built-ins


@dataclass
class Entry:
    """One registered backend, as declared; `problem` says why it cannot be used ('' when it can)."""

    name: str
    target: str                      # what the entry point names: "pkg.module" or "pkg.module:object"
    dist: str                        # the distribution that registered it
    kind: str = ""
    clock: str = ""
    options: dict = field(default_factory=dict)
    problem: str = ""
    declared: Any = None

    @property
    def builtin(self) -> bool:
        return self.dist == OWN

    @property
    def own_kernels(self) -> bool:
        """Does it run opscope's own kernels in this process (no foreign compiler, no vendor code)?"""
        return self.builtin and self.kind == "ops"

    @property
    def host_kernels(self) -> bool:
        """opscope's own kernels on real hardware (numpy, torch): no simulated clock, no description file needed."""
        return self.builtin and bool(self.hook("host_kernels"))

    @property
    def usage(self) -> str:
        """How a user spells it: `torch:DEVICE`, `sim:NAME`, or the bare name."""
        return getattr(self.declared, "usage", "") or self.name

    @property
    def summary(self) -> str:
        doc = getattr(self.declared, "summary", "") or (getattr(self.declared, "__doc__", "") or "")
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def hook(self, name: str):
        return getattr(self.declared, name, None) if not self.problem else None

    def available(self, desc) -> tuple[bool, str]:
        if self.problem:
            return False, self.problem
        try:
            got = self.declared.available(desc)
            ok, why = got
        except Exception as e:       # a vendor's check may raise anything
            return False, f"{self.name}: available() failed ({type(e).__name__}: {first_line(e)})"
        return bool(ok), "" if ok else (str(why) or "available() said no")

    def create(self, desc, name: str):
        """The backend for `desc`, named `name`; a plugin's failure is one line (UsageError)."""
        ok, why = self.available(desc)
        if not ok:
            raise UsageError(f"backend {name} is not available: {why}")
        if self.builtin:             # opscope's own raise OpscopeErrors already; a bug stays a traceback
            backend = self.declared.create(desc)
        else:
            try:
                backend = self.declared.create(desc)
            except UsageError:
                raise
            except Exception as e:
                raise UsageError(f"backend {name}: {self.target}.create() failed "
                                 f"({type(e).__name__}: {first_line(e)})") from e
        if getattr(backend, "name", None) is not None:     # a Backend (backends.create checks it: hdi is above this)
            backend.name = name
        return backend


@lru_cache(maxsize=1)
def entries() -> dict[str, Entry]:
    """name -> Entry, opscope's own first; read once per process (reload() reads again)."""
    found: dict[str, Entry] = {}
    for dist, ep in sorted(_points(), key=lambda p: p[0] != OWN):     # stable: opscope's own first
        entry = Entry(ep.name, ep.value, dist)
        if ep.name in found:         # a second package claiming a name: the first keeps it
            entry.name = f"{ep.name} ({entry.dist})"
            entry.problem = f"the name {ep.name!r} is taken by {found[ep.name].dist}; rename the entry point"
        elif not _NAME.match(ep.name):
            entry.problem = f"{ep.name!r} is not a backend name (a letter, then letters, digits, - or _)"
        else:
            _declare(entry, ep)
        found[entry.name] = entry
    # the built-ins in the order a user reads them (numpy, torch, sim, the stacks), then the packages
    return dict(sorted(found.items(), key=lambda kv: (not kv[1].builtin, getattr(kv[1].declared, "order", 9))))


def reload() -> dict[str, Entry]:
    """Read the entry points again (a package was installed or removed in this process's lifetime)."""
    entries.cache_clear()
    return entries()


def get(name: str) -> Entry | None:
    return entries().get(name)


def names(kind: str | None = None) -> list[str]:
    return [n for n, e in entries().items() if kind is None or e.kind == kind]


def host_timed() -> list[str]:
    """Names whose tracks are host calls opscope timed (the profiler classes their device strings as host)."""
    return [n for n, e in entries().items() if e.clock == "host"]


def specs_help() -> str:
    """What -b takes, for messages: every entry's spelling, then a description file."""
    return ", ".join(e.usage for e in entries().values() if not e.problem) + " or a path to a .toml description"


def _points() -> list[tuple[str, Any]]:
    """(distribution, entry point) of the group, from every copy of every distribution's metadata.
    NOTE: metadata.entry_points() keeps the first copy of a distribution on sys.path, and a stale
    opscope.egg-info in the current folder (a build's leftover) would hide the installed one's entries."""
    seen, out = set(), []
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "") if d.metadata else ""
        for ep in d.entry_points:
            if ep.group == GROUP and (name, ep.name) not in seen:
                seen.add((name, ep.name))
                out.append((name, ep))
    return out


def _declare(entry: Entry, ep) -> None:
    """Load the entry point and check what it declares; a problem is recorded, never raised."""
    try:
        obj = ep.load()
    except BaseException as e:       # a broken plugin may raise anything while importing, even SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        entry.problem = f"cannot import {ep.value} ({type(e).__name__}: {first_line(e)})"
        return
    entry.declared = obj
    missing = [f for f in ("available", "create") if not callable(getattr(obj, f, None))]
    if missing:
        entry.problem = f"{ep.value} has no {' and no '.join(f + '()' for f in missing)}"
        return
    entry.kind, entry.clock = getattr(obj, "kind", None), getattr(obj, "clock", None)
    for attr, allowed in (("kind", KINDS), ("clock", CLOCKS)):
        if getattr(entry, attr) not in allowed:
            entry.problem = (f"{ep.value}: {attr} is {getattr(entry, attr)!r}; expected one of "
                             f"{', '.join(repr(k) for k in allowed)}")
            return
    try:
        entry.options = check_schema(getattr(obj, "options", None) or {})
    except ValueError as e:
        entry.problem = f"{ep.value}: options: {e}"


def check_schema(schema) -> dict:
    """A plugin's option schema, normalised: key -> {type, choices, default, help}; ValueError says what is wrong."""
    if not isinstance(schema, dict):
        raise ValueError(f"expected a table of option name -> {{type, help, ...}}, got {type(schema).__name__}")
    out = {}
    for key, spec in schema.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise ValueError(f"{key!r} is not an option name")
        if not isinstance(spec, dict) or set(spec) - set(OPTION_KEYS):
            raise ValueError(f"{key}: expected a table with keys {', '.join(OPTION_KEYS)}")
        t = OPTION_TYPES.get(spec.get("type"), spec.get("type"))
        if t not in OPTION_TYPES.values():
            raise ValueError(f"{key}: type is {spec.get('type')!r}; expected one of {', '.join(OPTION_TYPES)}")
        if not isinstance(spec.get("help"), str) or not spec["help"].strip():
            raise ValueError(f"{key}: help is missing (one line saying what the option does)")
        choices = spec.get("choices")
        if choices is not None and (not isinstance(choices, (list, tuple)) or not choices
                                    or not all(_fits(c, t) for c in choices)):
            raise ValueError(f"{key}: choices must be a non-empty list of {t.__name__} values")
        if "default" in spec and (not _fits(spec["default"], t) or (choices and spec["default"] not in choices)):
            raise ValueError(f"{key}: default {spec['default']!r} is not one of its own values")
        out[key] = {"type": t, "choices": list(choices) if choices else None, "help": spec["help"].strip(),
                    **({"default": spec["default"]} if "default" in spec else {})}
    return out


def _fits(value, t) -> bool:
    if isinstance(value, bool) and t is not bool:
        return False
    return isinstance(value, (int, float) if t is float else t)


def check_options(options: dict, entry: Entry, bad) -> dict:
    """[backend.options] checked against the entry's schema (bad(key, what) raises); defaults filled in."""
    if entry.problem:                 # it cannot run anyway; create() says why
        return dict(options)
    schema = entry.options
    if options and not schema:
        bad("backend.options", f"{entry.name} takes no options; remove [backend.options]")
    for key, value in options.items():
        if key not in schema:
            bad(f"backend.options.{key}", f"unknown option; {entry.name} takes {', '.join(schema)}")
        s = schema[key]
        if not _fits(value, s["type"]):
            bad(f"backend.options.{key}", f"expected {s['help']} ({s['type'].__name__}), got "
                                          f"{type(value).__name__} {_short(value)}")
        if s["choices"] and value not in s["choices"]:
            bad(f"backend.options.{key}", f"expected one of {', '.join(map(str, s['choices']))}, got {_short(value)}")
    return {**{k: s["default"] for k, s in schema.items() if "default" in s}, **options}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
