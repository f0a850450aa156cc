"""Build (once) and load the native observer: torch.utils.cpp_extension, cached per torch version and source.

    mod, note = load()          # the extension module, or None and one line saying why (no compiler, ...)

The build lands in $OPSCOPE_NATIVE_CACHE, else $XDG_CACHE_HOME/opscope/native or ~/.cache/opscope/native
(not under OPSCOPE_HOME: every test gets its own home, and a build takes about a minute), in a folder
named by torch's version and a hash of the source, so a new torch or a changed observer builds afresh
and nothing else ever rebuilds. torch's own file lock keeps two processes from building at once.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("observer.cpp")
CACHE_ENV = "OPSCOPE_NATIVE_CACHE"
_loaded: tuple | None = None


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opscope" / "native"


FLAGS = ["-O2", "-DNDEBUG"]


def build_key() -> str:
    import torch
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]
    return f"torch{torch.__version__.replace('+', '_')}-{digest}"


def is_built() -> bool:
    """True when load() will not compile (the extension for this torch and source is cached)."""
    folder = cache_dir() / build_key()
    return any(folder.glob("opscope_native_*.so")) or any(folder.glob("opscope_native_*.pyd"))


def load(*, quiet: bool = True):
    """(module, None), or (None, why) when the observer cannot be built here."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _loaded = _load(quiet)
    return _loaded


def _load(quiet: bool):
    if not SOURCE.is_file():
        return None, "the native engine's source is not installed"
    compiler = os.environ.get("CXX") or "c++"      # what torch.utils.cpp_extension builds with
    if not is_built() and shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler}) to build the native engine"
    try:
        from torch.utils import cpp_extension
        key = build_key()
        folder = cache_dir() / key
        folder.mkdir(parents=True, exist_ok=True)
        if not is_built() and not quiet:
            print("opscope: building the native profiler engine once for this torch (about a minute)...",
                  file=sys.stderr, flush=True)
        # NOTE: -DNDEBUG as libtorch was built: RecordFunction has debug-only members, and a build
        # without it reads the struct with another layout (and asserts on valid calls)
        mod = cpp_extension.load(name=f"opscope_native_{key.rsplit('-', 1)[1]}", sources=[str(SOURCE)],
                                 build_directory=str(folder), extra_cflags=FLAGS, verbose=False)
    except Exception as e:   # a compiler error, missing headers, a read-only cache: the eager engine works
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return None, f"the native engine did not build ({type(e).__name__}: {line[:200]})"
    return mod, None
