"""Reading files from folders a user points at -- checkpoints, shared run folders, plans, keys, traces --
the one bounded way: nothing in such a file can hang opscope, make it allocate past a bound, or reach
arithmetic and SQL with a number out of range.

    f = open_regular(path, where, what)               # a regular file, or one line: never blocks on a FIFO
    data = read_bounded(path, limit, where, what)     # its bytes, refused by size before any is read
    doc = parse_json(data, where, what)               # JSON nested at most MAX_DEPTH deep (scanned first)
    doc = read_small_json(path, limit)                # ... or None: a file of opscope's that reads as never written
    n = checked_int(doc.get("steps"), where, "steps", 1, MAX_STEPS)   # range-checked before it is used
    shape, dtype, _ = npy_header(member, where, what) # a .npy header (its size bounded) before its data

`where` names the file as the user sees it ("plan x.opsplan", "--checkpoint-dir D: checkpoint.npz") and
`what` says what to do; every refusal is one UsageError line: "<where> <what is wrong>; <what to do>".
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import TYPE_CHECKING

from .errors import UsageError, first_line

if TYPE_CHECKING:
    import numpy as np

MAX_DEPTH = 64                  # opscope's own files nest a few levels; Python's parsers recurse once per level
MAX_STEPS = 10 ** 9             # steps of a run or a job: the events table's step column is a 32-bit integer
MAX_RANKS = 65_536              # ranks of a job (world_size)
MAX_NS = 2 ** 62                # event times (ns): any end - start, and any span across events, fits in INT64
MAX_NPY_HEADER = 64 << 10       # numpy writes a few hundred bytes; its own ceiling (10,000) makes a 2-line error

_READ = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    return "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "not a regular file"


def open_regular(path, where: str, what: str):
    """The file opened for reading -- non-blocking (a FIFO with no writer would block open() for ever), then
    fstat'ed: a folder, FIFO, socket or device is refused before a byte of it is read."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        raise UsageError(f"{where} does not exist; {what}") from None
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"{where} cannot be opened ({getattr(e, 'strerror', None) or first_line(e)[:80]}); "
                         f"{what}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _kind(mode)
        raise UsageError(f"{where} is {kind}{'' if kind.startswith('not') else ', not a regular file'}; {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path, limit: int, where: str, what: str, over: str | None = None) -> bytes:
    """At most `limit` bytes of a regular file: its size is checked before reading, and a file that grew
    since is cut at `limit` + 1 and refused. `over` is the advice for a file that is too big."""
    with open_regular(path, where, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UsageError(f"{where} is {size} bytes, more than opscope ever reads there ({limit} at most); "
                             f"{over or what}")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"{where} cannot be read ({e.strerror or e}); {what}") from None
    if len(data) > limit:
        raise UsageError(f"{where} grew past {limit} bytes while it was read; {over or what}")
    return data


# a JSON string, escapes included: removed before nesting is counted ("[" inside a string is no nesting)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_CHUNK = 1 << 20


def json_depth(data: bytes) -> int:
    """How deep the JSON text nests ([ and { outside strings), scanned without recursion in bounded memory."""
    import numpy as np        # here, not above: the CLI's file checks open files with this module before numpy
    data = _STRING.sub(b"", data)
    deepest = depth = 0
    for at in range(0, len(data), _CHUNK):
        b = np.frombuffer(data, np.uint8, min(_CHUNK, len(data) - at), at)
        step = (b == ord("[")).astype(np.int32) + (b == ord("{")) - (b == ord("]")) - (b == ord("}"))
        if step.size:
            run = np.cumsum(step, dtype=np.int64) + depth
            deepest, depth = max(deepest, int(run.max())), int(run[-1])
    return deepest


def parse_json(data: bytes | str, where: str, what: str, max_depth: int = MAX_DEPTH):
    """JSON text -> Python objects, or one line: not JSON, or nested deeper than `max_depth`."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if json_depth(raw) > max_depth:
        raise UsageError(f"{where} nests deeper than {max_depth} levels, which opscope never writes; {what}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:     # UnicodeDecodeError is a ValueError
        raise UsageError(f"{where} is not valid JSON ({first_line(e)[:80]}); {what}") from None


def read_json(path, limit: int, where: str, what: str, max_depth: int = MAX_DEPTH):
    return parse_json(read_bounded(path, limit, where, what), where, what, max_depth)


def read_small_json(path, limit: int):
    """The JSON in a small file opscope keeps (or a shared folder holds), or None when it is missing,
    unreadable, not a regular file, over `limit` bytes, too deep or not JSON: such a file reads as never
    written, and at most `limit` + 1 bytes of it are read."""
    try:
        return read_json(path, limit, str(path), "")
    except UsageError:
        return None


def checked_int(value, where: str, name: str, lo: int, hi: int, what: str = ""):
    """`value` when it is an integer (not a bool) in lo..hi; else one line naming the field and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        shown = repr(value) if isinstance(value, (int, float, bool, type(None))) else type(value).__name__
        raise UsageError(f"{where} has {name} = {shown[:40]}, expected an integer {lo}..{hi}"
                         f"{'; ' + what if what else ''}")
    return value


def npy_header(f, where: str, what: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran_order) from the .npy header at the stream's position, before any of its data is read: the
    header's length is bounded, an object dtype (a pickle) and a non-integer shape are refused."""
    import numpy as np
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f".npy version {version}")
        width = 2 if version == (1, 0) else 4
        length = int.from_bytes(f.read(width), "little")
        if length > MAX_NPY_HEADER:
            raise UsageError(f"{where} holds a .npy header of {length} bytes (numpy writes a few hundred); {what}")
        header = f.read(length)
        if len(header) != length:
            raise ValueError("the header is cut short")
        d = _header_dict(header.decode("utf-8" if version == (3, 0) else "latin1"))
        dtype = np.lib.format.descr_to_dtype(d["descr"])
        shape = d["shape"]
        if not (isinstance(shape, tuple) and all(type(n) is int and 0 <= n < 2 ** 63 for n in shape)) \
                or len(shape) > 64 or not isinstance(d["fortran_order"], bool):
            raise ValueError("its shape is not a tuple of sizes")
    except UsageError:
        raise
    except Exception as e:           # read_magic and descr_to_dtype raise several types on garbage
        raise UsageError(f"{where} holds a damaged .npy header ({type(e).__name__}: {first_line(e)[:80]}); "
                         f"{what}") from None
    if dtype.hasobject:
        raise UsageError(f"{where} holds an object array (a pickle, which opscope never loads); {what}")
    return shape, dtype, d["fortran_order"]


def _header_dict(text: str) -> dict:
    import ast
    d = ast.literal_eval(text)      # numpy's own reader does the same; the text is bounded above
    if not (isinstance(d, dict) and set(d) == {"descr", "shape", "fortran_order"}):
        raise ValueError("not a .npy header dictionary")
    return d
