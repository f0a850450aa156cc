"""A plan archive read with every byte bounded: what `.opsplan` files someone sent you may not do.

    with PlanArchive.open(path, where) as a:      # UsageError: not a regular file, not a zip at byte 0, ...
        body = a.read("plan.json", MAX_JSON)      # a bounded stream, never more than `limit` bytes
        a.names                                   # every member, each already vetted

Refused before anything is read: a path that is a folder, a FIFO or a device (or a symlink to one,
such as /dev/zero); an archive that does not start at byte 0 (a polyglot: a shared library or anything
else in front of the zip); a member that is not a regular file (a stored symlink), is encrypted, uses a
compression other than stored/deflate, has a name that is not part of the format, appears twice, or
claims a size over its bound or a compression ratio no deflate stream reaches (a zip bomb).
"""
from __future__ import annotations

import os
import re
import stat
import zipfile

from .. import safe_read
from ..errors import UsageError, first_line

MAX_MEMBERS = 65535           # what a zip without zip64 extensions holds; plans hold a few hundred
MAX_RATIO = 1100              # deflate's ceiling is about 1032:1 (zeros): anything above is a lie
MEMBER = re.compile(r"^(plan\.json|plan\.sha256|plan\.sig|constants/\d{1,9}\.npy|regions/region\d{1,6}\.bin)$")


class PlanArchive:
    def __init__(self, f, z: zipfile.ZipFile, infos: dict, where: str):
        self._f, self._z, self.infos, self.where = f, z, infos, where

    @property
    def names(self) -> list[str]:
        return list(self.infos)

    @classmethod
    def open(cls, path, where: str) -> "PlanArchive":
        f = open_regular(path, where)
        try:
            if f.read(4) != b"PK\x03\x04":
                raise UsageError(f"{where}: corrupted or truncated, or not a plan (a plan is a zip archive that "
                                 "starts at byte 0); compile it again")
            f.seek(0)
            z = zipfile.ZipFile(f)
            return cls(f, z, _vetted(z, os.fstat(f.fileno()).st_size, where), where)
        except UsageError:
            f.close()
            raise
        except Exception as e:      # zipfile raises many types on a damaged archive
            f.close()
            raise UsageError(f"{where}: corrupted or truncated ({type(e).__name__}: {first_line(e)[:80]}); "
                             "compile it again") from None

    def size(self, name: str) -> int:
        return self.infos[name].file_size

    def read(self, name: str, limit: int) -> bytes:
        """The member's bytes, refused past `limit`; a stream that inflates past its stated size fails its CRC."""
        info = self.infos[name]
        if info.file_size > limit:
            raise UsageError(f"{self.where}: member {name} holds {info.file_size} bytes, over its {limit}-byte "
                             "bound; compile the plan again")
        try:
            with self._z.open(info) as m:
                data = m.read(limit + 1)
        except Exception as e:      # zlib and friends raise their own errors on damaged archives
            raise UsageError(f"{self.where}: corrupted or truncated ({type(e).__name__}: {first_line(e)[:80]}); "
                             "compile it again") from None
        if len(data) > limit:
            raise UsageError(f"{self.where}: member {name} inflates past its {limit}-byte bound; compile it again")
        return data

    def close(self):
        self._z.close()
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_regular(path, where: str, what: str = "make one with `opscope compile MODEL -b BACKEND -o FILE.opsplan` "
                 "(a plan is one file; unpacked folders are not read)"):
    """The bounded reader's open (runtime/safe_read.py): non-blocking, then a regular file or one line."""
    return safe_read.open_regular(path, where, what)


def _vetted(z: zipfile.ZipFile, file_bytes: int, where: str) -> dict:
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise UsageError(f"{where}: holds {len(infos)} members, over the {MAX_MEMBERS} a plan may have")
    # zipfile shifts every offset by whatever precedes the archive: the first member must sit at byte 0
    if not infos or min(i.header_offset for i in infos) != 0:
        raise UsageError(f"{where}: the zip archive does not start at byte 0 (something is in front of it); "
                         "a plan is only a zip -- compile it again")
    out = {}
    for i in infos:
        name = i.filename
        shown = ascii(name)[:80]
        if not MEMBER.match(name):
            raise UsageError(f"{where}: holds member {shown}, which is not part of a plan; compile it again")
        if name in out:
            raise UsageError(f"{where}: holds member {shown} twice; compile it again")
        kind = (i.external_attr >> 16) & 0o170000
        if i.is_dir() or (kind and not stat.S_ISREG(kind)):
            raise UsageError(f"{where}: member {shown} is not a regular file (a link or a folder); compile it again")
        if i.flag_bits & 0x1:
            raise UsageError(f"{where}: member {shown} is encrypted; compile the plan again")
        if i.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise UsageError(f"{where}: member {shown} uses compression method {i.compress_type}; plans are "
                             "stored or deflated -- compile it again")
        stored = i.compress_type == zipfile.ZIP_STORED
        if i.compress_size > file_bytes or (stored and i.file_size != i.compress_size) or \
                i.file_size > MAX_RATIO * max(i.compress_size, 1):
            raise UsageError(f"{where}: member {shown} claims {i.file_size} bytes from {i.compress_size} "
                             "(more than any real compression gives); refused unread -- compile it again")
        out[name] = i
    return out
