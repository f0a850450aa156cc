"""A precompiled header for HIP-CPU builds: g++ reads HIP-CPU's headers and opscope's gaps header once, not once a program.

    include = precompiled(flags, GAPS, cache)   # a copy of GAPS with its .gch beside it, or None
    g++ ... -include <include> unit.cu          # g++ loads the .gch instead of reading the header

HIP-CPU is header-only and pulls in TBB and libstdc++'s parallel algorithms (about 460 files): parsing them was
4 of the 5.5 CPU seconds g++ spent on vectorAdd. An entry is a folder named by its key (the compiler's binaries and
version, the flags, the header's text); its manifest lists every file the header read with its SHA-256, and the
.gch's own. An entry is used only when all of those still match and the folder and files are the user's alone
(no one else can write them): a changed TBB or HIP-CPU header, a truncated or swapped .gch, or a folder someone else
can write is rebuilt, never used. When the header cannot be precompiled the caller includes it as text, as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from opscope.runtime.errors import UsageError
from opscope.runtime.home import private_folder
from opscope.runtime.safe_read import open_regular, read_small_json

KEEP = 3                        # entries kept (one is ~140 MB); the least recently used go first
_MANIFEST = "manifest.json"
_MANIFEST_LIMIT = 4 << 20       # ~460 paths with their hashes take ~70 KB; a bigger one was not written here


def precompiled(flags: list[str], header: Path, cache: Path, *, timeout: float = 600) -> Path | None:
    """The path to `-include` (first) in builds with exactly `flags` (the compiler, then its options), or None."""
    try:
        private_folder(cache)
        key = _key(flags, header)
        entry = cache / key
        if _valid(entry, key, header.name):
            os.utime(entry / _MANIFEST)                        # recently used: pruned last
            return entry / header.name
        built = _build(flags, header, cache, key, timeout)
    except (OSError, subprocess.SubprocessError, ValueError, UsageError):
        return None
    if built is None:
        return None
    try:
        if entry.exists():                                     # stale or not ours alone: set aside, never reused
            os.rename(entry, cache / f"old-{key}-{os.getpid()}")
        os.rename(built, entry)
    except OSError:                                            # another build won the race: use ours where it lies
        return built / header.name if _valid(built, key, header.name) else None
    _prune(cache)
    return entry / header.name


def _key(flags: list[str], header: Path) -> str:
    gxx = shutil.which(flags[0]) or flags[0]
    cc1 = subprocess.run([gxx, "-print-prog-name=cc1plus"], capture_output=True, text=True, timeout=30).stdout.strip()
    version = subprocess.run([gxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    binaries = []
    for b in (gxx, cc1):
        real = os.path.realpath(b)
        st = os.stat(real)
        binaries.append([real, st.st_size, st.st_mtime_ns])
    what = [binaries, version, flags[1:], _sha256(header)]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def _build(flags: list[str], header: Path, cache: Path, key: str, timeout: float) -> Path | None:
    folder = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    copy, gch, deps = folder / header.name, folder / (header.name + ".gch"), folder / "deps.d"
    shutil.copyfile(header, copy)
    r = subprocess.run([*flags, "-x", "c++-header", str(copy), "-o", str(gch), "-MD", "-MF", str(deps)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not gch.is_file():
        shutil.rmtree(folder, ignore_errors=True)
        return None
    read = [p for p in _make_deps(deps.read_text()) if Path(p) != copy]
    manifest = {"key": key, "gch": _sha256(gch), "header": _sha256(copy), "read": {p: _sha256(Path(p)) for p in read}}
    (folder / _MANIFEST).write_text(json.dumps(manifest))
    deps.unlink()
    for f in folder.iterdir():                                 # whatever the umask: ours alone, or never valid
        os.chmod(f, 0o600)
    return folder


def _valid(entry: Path, key: str, name: str) -> bool:
    """Every file the .gch was made from is unchanged, the .gch is the one built, and only the user can write them.
    The manifest is read bounded and every path in it opened as a regular file only (a FIFO named there would block
    the hash for ever): it is checked, never trusted."""
    try:
        if not all(_ours_alone(p) for p in (entry, *entry.iterdir())):
            return False
        manifest = read_small_json(entry / _MANIFEST, _MANIFEST_LIMIT)
        return (manifest["key"] == key and manifest["header"] == _sha256(entry / name)
                and all(_sha256(Path(p)) == h for p, h in manifest["read"].items())
                and manifest["gch"] == _sha256(entry / (name + ".gch")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UsageError):
        return False


def _ours_alone(path: Path) -> bool:
    st = os.lstat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)


def _make_deps(text: str) -> list[str]:
    """The prerequisites of a `g++ -MD` rule (`target: a b \\` lines; a space in a name is `\\ `)."""
    words = text.replace("\\\n", " ").partition(": ")[2].replace("\\ ", "\0").split()
    return [w.replace("\0", " ") for w in words]


def _prune(cache: Path) -> None:
    """Remove entries set aside, builds left by a killed run and all but the KEEP most recently used entries."""
    entries = []
    for p in cache.iterdir():
        if p.name.startswith("old-") or p.name.startswith("build-") and time.time() - p.stat().st_mtime > 3600:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir() and (p / _MANIFEST).is_file():
            entries.append(((p / _MANIFEST).stat().st_mtime, p))
    for _, p in sorted(entries, reverse=True)[KEEP:]:
        shutil.rmtree(p, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path, str(path), "") as f:         # never a FIFO or a device: a hash that ends
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
