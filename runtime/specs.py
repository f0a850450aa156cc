"""What a backend spec and a model spec may be, checked without importing torch or a stack.

    check_backend_spec("sim:npu-a2")   # UsageError: unknown sim backend 'npu-a2' ... (did you mean npu-a1?)
    check_model_spec("demo:gtp")       # UsageError: unknown model spec 'demo:gtp' ... (did you mean demo:gpt?)

The CLI checks both while it parses the command line, before torch is imported (a typo waited 2 s
of CPU, 25 s on a loaded machine, for a one-line answer). runtime/backends.describe() and
runtime/models.load() start from the same checks and do the full work.
"""
from __future__ import annotations

import difflib
from pathlib import Path

from . import registry
from .errors import UsageError
from .home import opscope_home

BUNDLED = Path(__file__).resolve().parent / "descriptions"


def specs_help() -> str:
    """What -b takes: every registered backend's spelling (runtime/registry.py), or a description file."""
    return registry.specs_help()


def description_paths() -> dict[str, Path]:
    """name -> sim description file: bundled first, then the user's own (which may override).
    A registered backend's bundled description (onnxruntime.toml) is its own, not a sim chip."""
    found = {}
    for folder in (BUNDLED, opscope_home() / "backends"):
        if folder.is_dir():
            for p in sorted(folder.glob("*.toml")):
                if not (folder == BUNDLED and registry.get(p.stem) is not None):
                    found[p.stem] = p
    return found


DEMOS = ("mlp", "cnn", "gpt")


def check_model_spec(spec: str) -> str:
    """`spec` stripped, when it is a bundled demo or an existing file.py:factory; else a UsageError."""
    spec = (spec or "").strip()
    if spec.startswith("demo:"):
        if spec[5:] not in DEMOS:
            demos = [f"demo:{d}" for d in DEMOS]
            raise UsageError(f"unknown model spec {spec!r}: bundled demos are {', '.join(demos)}"
                             f"{did_you_mean(spec, demos)}")
        return spec
    path, sep, _ = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise UsageError(f"bad model spec {spec!r}: use demo:NAME or path/to/file.py:factory")
    if not is_file(path):
        raise UsageError(f"model file {path} does not exist: check the path in {spec!r}")
    return spec


def did_you_mean(word: str, known) -> str:
    """' (did you mean X?)' for the closest of `known`, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):          # a name too long for the file system, a NUL byte: not a file
        return False


def check_backend_spec(spec: str) -> str:
    """`spec` stripped, when it names a backend that may exist; a UsageError saying what exists when it cannot.
    Whether the device is there, or the description well-formed, is describe()'s to say."""
    spec = (spec or "").strip()
    from .autoplace import spec as auto
    if auto.is_auto(spec):                                   # auto[:stack,...]: each named stack checked
        auto.candidates(spec)
        return spec
    base, _, device = spec.partition(":")
    if base != "sim" and registry.get(base) is not None:     # the entry's describe() checks the rest
        return spec
    if base == "sim":
        paths = description_paths()
        if device not in paths:
            raise UsageError(f"unknown sim backend {device!r}: known are {', '.join(sorted(paths)) or 'none'}; "
                             f"or give a path to a .toml description{did_you_mean(device, paths)}")
        return spec
    if spec.endswith(".toml") and not is_file(spec):
        what = "is not a regular file" if Path(spec).exists() else "does not exist"
        raise UsageError(f"backend description {spec} {what}: give a path to a .toml file")
    if spec.endswith(".toml") or is_file(spec):
        return spec
    names = [n for n in registry.names() if n != "sim"] + [f"sim:{n}" for n in description_paths()]
    raise UsageError(f"unknown backend {spec!r}: use {specs_help()} (`opscope backends` lists them)"
                     f"{did_you_mean(spec, names)}")
