"""OPSCOPE_HOME: where runs, tuning caches and user backend descriptions live.

Runs hold host names, source paths and shapes: the folders opscope creates for them are private
to the user (0700), the way ssh and gpg keep theirs.
"""
import os
import stat
from pathlib import Path

HOME_ENV = "OPSCOPE_HOME"


def opscope_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".opscope")


def private_folder(folder: Path, *, fix: bool = True) -> None:
    """Create `folder` (and its parents) with mode 0700; with `fix`, make an existing one of ours 0700 too.

    Never touches a folder that is not the user's, nor a shared sticky one (/tmp given as the home):
    tightening those would break other people's work. Raises OSError as os.mkdir does.
    """
    folder = Path(folder)
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
            return
        except FileExistsError:
            if not folder.is_dir():
                raise NotADirectoryError(20, "Not a directory", str(folder)) from None
    if not fix:
        return
    st = folder.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077 and not st.st_mode & stat.S_ISVTX \
            and folder.resolve() != Path(folder.anchor):
        os.chmod(folder, 0o700)


def private_file(path: Path) -> None:
    """A file of ours that others may read -> 0600 (absent files and other people's are left alone)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and st.st_mode & 0o077 and stat.S_ISREG(st.st_mode):
        os.chmod(path, 0o600)


def read_small_json(path, limit: int):
    """The JSON in a small file opscope keeps, or None: safe_read.read_small_json (the bounded reader) says how."""
    from .safe_read import read_small_json as read       # numpy only when a file is read
    return read(path, limit)
