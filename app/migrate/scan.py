"""Walk a code base and scan every Python and C/C++/CUDA source in it.

A file that does not parse becomes a `parse-error` finding and the walk goes on; binary files,
files over the size limit, symbolic links (never followed: the tree may come from anyone), FIFOs and
devices are skipped with a note (files.py reads them safely). Python files that mention none of the
CUDA words are only syntax-checked with the (much faster) builtin parser: libcst, which keeps
every byte for rewriting, is paid for where there can be something to find.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from opscope.runtime.errors import UsageError

from .c_scan import SUFFIXES as C_SUFFIXES, scan_c
from .files import Skip, kind_of, link_reason, read_source
from .python_scan import PyScan, scan_python
from .rules import Finding, Table, default_table

MAX_BYTES = 2 * 1024 * 1024
BINARY_SNIFF = 8192
SKIP_DIRS = {"__pycache__", "node_modules", ".git", ".hg", ".svn", ".tox", ".venv", "venv", "site-packages"}
# a Python file with none of these bytes cannot hold a finding
# NOTE: a table row for a name that contains none of them needs its word here (a gloo script's
# `DistributedDataParallel(model, device_ids=[rank])` never says cuda)
_WORDS = (b"cuda", b"cudnn", b"nccl", b"cupy", b"apex", b"flash_attn", b"bitsandbytes", b"triton",
          b"DistributedDataParallel", b"CUDAExtension", b"CUDA_HOME")


@dataclass
class Skipped:
    file: str
    reason: str


@dataclass
class ScanResult:
    root: str
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)   # scanned file -> lines
    python_trees: dict[str, PyScan] = field(default_factory=dict)   # kept for `apply`
    c_texts: dict[str, str] = field(default_factory=dict)           # C/C++/CUDA sources, kept for `apply`

    @property
    def lines(self) -> int:
        return sum(self.files.values())


def source_files(root: Path, skipped: list | None = None) -> list[Path]:
    """Python and C/C++/CUDA files under `root` (or `root` itself), sorted, hidden folders left out. Only
    regular files: links (to files or folders) and FIFOs/devices go to `skipped` as (path, why), from
    lstat, so nothing is opened that could block, never end or lead out of the tree."""
    if root.is_file():
        return [root]
    out = []
    skipped = [] if skipped is None else skipped
    for folder, dirs, names in os.walk(root):          # followlinks=False: a linked folder is not entered
        keep = []
        for d in sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")):
            if os.path.islink(os.path.join(folder, d)):
                skipped.append((Path(folder) / d, link_reason(Path(folder) / d, root)))
            else:
                keep.append(d)
        dirs[:] = keep
        for n in sorted(names):
            if n.endswith(".py") or n.endswith(C_SUFFIXES):
                p = Path(folder) / n
                try:
                    kind = kind_of(os.lstat(p))
                except OSError as e:
                    skipped.append((p, f"unreadable: {e.strerror or e}"))
                    continue
                if kind == "a symbolic link":
                    skipped.append((p, link_reason(p, root)))
                elif kind is not None:
                    skipped.append((p, f"{kind}, not a regular file; not read"))
                else:
                    out.append(p)
    return out


def scan_path(path: str | Path, *, table: Table | None = None, max_bytes: int = MAX_BYTES, progress: bool = False,
              keep_trees: bool = False, jobs: int = 1) -> ScanResult:
    """Scan a folder or a file. `jobs` > 1 scans in that many worker processes (not with keep_trees: the
    rewrite needs the libcst trees in this process)."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{path} does not exist: give a folder or a source file to scan")
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected 1 or more worker processes")
    table = table or default_table()
    odd: list = []
    files = source_files(root, odd)
    base = root if root.is_dir() else root.parent
    rels = [p.relative_to(base).as_posix() if root.is_dir() else p.name for p in files]
    result = ScanResult(str(root))
    result.skipped.extend(Skipped(p.relative_to(base).as_posix(), why) for p, why in odd)
    follow_root = not root.is_dir()          # the file the user named may be a link: their choice
    with _progress(len(files), progress) as advance:
        if jobs > 1 and not keep_trees and table is default_table() and len(files) > jobs:
            _scan_parallel(files, rels, max_bytes, result, jobs, advance)
        else:
            for p, rel in zip(files, rels):
                _scan_file(p, rel, table, max_bytes, result, keep_trees, follow_root)
                advance()
    result.findings.sort(key=lambda f: (f.file, f.line, f.column))
    return result


_CHUNK = 64     # files per task: big enough that a task outweighs its round trip


def _scan_parallel(files, rels, max_bytes, result: ScanResult, jobs: int, advance) -> None:
    import concurrent.futures as cf
    import json
    import multiprocessing
    # NOTE: workers answer in JSON over their private pipe; nothing they send is unpickled as objects.
    tasks = [([str(p) for p in files[i:i + _CHUNK]], rels[i:i + _CHUNK]) for i in range(0, len(files), _CHUNK)]
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for doc in pool.map(_scan_chunk, tasks, [max_bytes] * len(tasks)):
            part = json.loads(doc)
            result.findings.extend(Finding(**f) for f in part["findings"])
            result.skipped.extend(Skipped(**k) for k in part["skipped"])
            result.files.update(part["files"])
            for _ in range(part["n"]):
                advance()


def _scan_chunk(task, max_bytes: int) -> str:
    import json
    from dataclasses import asdict
    paths, rels = task
    part = ScanResult("")
    table = default_table()
    for p, rel in zip(paths, rels):
        _scan_file(Path(p), rel, table, max_bytes, part, False)
    return json.dumps({"findings": [asdict(f) for f in part.findings], "skipped": [asdict(k) for k in part.skipped],
                       "files": part.files, "n": len(paths)})


def _scan_file(p: Path, rel: str, table: Table, max_bytes: int, result: ScanResult, keep_tree: bool,
               follow: bool = False) -> None:
    try:
        data = read_source(p, max_bytes, follow=follow)
    except Skip as e:
        result.skipped.append(Skipped(rel, str(e)))
        return
    if b"\0" in data[:BINARY_SNIFF]:
        result.skipped.append(Skipped(rel, "binary (NUL bytes)"))
        return
    result.files[rel] = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if p.suffix == ".py":
        if not any(w in data for w in _WORDS):
            err = _syntax_error(rel, data)
            if err is not None:
                result.findings.append(err)
            return
        scanned = scan_python(rel, data, table)
        if isinstance(scanned, Finding):
            result.findings.append(scanned)
            return
        result.findings.extend(scanned.findings)
        if keep_tree:
            result.python_trees[rel] = scanned
    else:
        # NOTE: surrogateescape keeps bytes that are not UTF-8, so a rewrite writes them back unchanged
        text = data.decode("utf-8", errors="surrogateescape")
        result.findings.extend(scan_c(rel, text, table))
        if keep_tree:
            result.c_texts[rel] = text


def _syntax_error(rel: str, data: bytes) -> Finding | None:
    try:
        compile(data, rel, "exec", flags=0x400, dont_inherit=True)   # ast.PyCF_ONLY_AST: parse, don't compile
    except SyntaxError as e:
        return Finding(rel, e.lineno or 1, e.offset or 1, "parse-error", "parse-error", "error",
                       "fix the syntax error; the file was not scanned", "python", note=e.msg)
    except (ValueError, UnicodeDecodeError) as e:
        return Finding(rel, 1, 1, "parse-error", "parse-error", "error",
                       "fix the file's encoding; the file was not scanned", "python", note=str(e).splitlines()[0])
    return None


@contextlib.contextmanager
def _progress(total: int, show: bool):
    """advance() for each file scanned: the bar of app/progress.py on stderr, or nothing."""
    from opscope.app.progress import progress_bar
    with progress_bar("scanning", total=total, unit="files", show=show) as update:
        yield lambda: update(advance=1)
