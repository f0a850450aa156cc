"""Reading and writing the files of a tree someone handed you (a tarball, a clone): never through a link.

    data = read_source(path, max_bytes)        # bytes, or raises Skip("why") -- never blocks, never unbounded
    write_source(path, data)                   # FILE.orig backup made once, then FILE replaced; no link followed

A tree is untrusted input. A `.py` that is a symbolic link may point anywhere (`~/.bashrc`, /dev/zero), a
FIFO blocks a reader for ever, a device never ends. So: the walk reports links, FIFOs and devices from
lstat and reads none of them; a read opens with O_NOFOLLOW | O_NONBLOCK and checks the opened file again
(fstat: a regular file, within the size bound) before reading at most the bound; a write never opens the
existing file -- it writes a new file beside it (O_EXCL) and renames it over the name, which replaces a
link swapped in meanwhile instead of writing through it, and leaves a hard link's other names alone.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class Skip(Exception):
    """A file the scan leaves alone; str() says why, in the words the report prints."""


def kind_of(st: os.stat_result) -> str | None:
    """None for a regular file, else what it is ("a FIFO", "a device", ...)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def link_reason(path: Path, root: Path) -> str:
    """Why a symbolic link in the tree is not followed, saying whether it leads out of the tree."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):          # a loop of links
        inside = False
    where = "inside the tree" if inside else "outside the tree"
    return f"a symbolic link to {target[:200]} ({where}); links are never followed"


def read_source(path: Path, max_bytes: int, follow: bool = False) -> bytes:
    """The file's bytes, at most `max_bytes`, or Skip. `follow`: the path the user named on the command line
    may itself be a link (their own choice); nothing found in the tree is followed."""
    flags = _READ & ~getattr(os, "O_NOFOLLOW", 0) if follow else _READ
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and os.path.islink(path):        # ELOOP: O_NOFOLLOW met a link swapped in
            raise Skip("a symbolic link; links are never followed") from None
        raise Skip(f"unreadable: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        kind = kind_of(st)
        if kind is not None:
            raise Skip(f"{kind}, not a regular file; not read")
        if st.st_size > max_bytes:
            raise Skip(f"over the size limit ({st.st_size} > {max_bytes} bytes)")
        chunks, size = [], 0
        while size <= max_bytes:               # bounded even if the file grows while it is read
            part = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not part:
                break
            chunks.append(part)
            size += len(part)
        if size > max_bytes:
            raise Skip(f"over the size limit (more than {max_bytes} bytes)")
        return b"".join(chunks)
    except OSError as e:
        raise Skip(f"unreadable: {e.strerror or e}") from None
    finally:
        os.close(fd)


def backup_problem(target: Path) -> str | None:
    """Why `target.orig` cannot take the backup (it is a link, a FIFO, ...), or None when it is absent or a
    regular file (an earlier apply's backup, kept)."""
    backup = target.with_name(target.name + ".orig")
    try:
        kind = kind_of(os.lstat(backup))
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"its backup {backup.name} is unreadable ({e.strerror or e}); not written"
    return None if kind is None else f"its backup {backup.name} is {kind}; not written (remove {backup.name} first)"


def write_source(target: Path, data: bytes, max_bytes: int) -> None:
    """Replace `target` with `data`, keeping its original as `target.orig` (made once: a second apply must not
    overwrite the real original). Raises Skip when the backup name or the target is a link or not a regular
    file (nothing written then), OSError when the disk refuses."""
    why = backup_problem(target)
    if why is not None:
        raise Skip(why)
    st = os.lstat(target)
    if kind_of(st) is not None:
        raise Skip(f"{kind_of(st)}; not written")
    backup = target.with_name(target.name + ".orig")
    if not os.path.lexists(backup):
        _create(backup, read_source(target, max_bytes), st.st_mode)
    tmp = target.with_name(f".{target.name}.opscope-{os.getpid()}.tmp")
    _create(tmp, data, st.st_mode)
    try:
        os.replace(tmp, target)          # replaces the name: a link put there meanwhile is replaced, not followed
    except OSError:
        os.unlink(tmp)
        raise


def _create(path: Path, data: bytes, mode: int) -> None:
    """A new file (O_EXCL: never an existing one, never through a link) holding `data`."""
    fd = os.open(path, _CREATE, stat.S_IMODE(mode) & 0o777)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
