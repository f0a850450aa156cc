"""`opscope migrate check --compile TREE`: rewrite a CUDA tree to HIP in a scratch folder and compile it.

    result = compile_tree("samples/", run=True)
    result.compiler          # "hipcc" or "HIP-CPU (g++ -std=c++17, TBB)"
    result.programs          # [Program(source, built, ran, returncode, output)]

hipcc (ROCm) is used when it is on PATH. Otherwise HIP-CPU, a header-only HIP runtime for CPUs, when
$OPSCOPE_HIP_CPU names its folder (the one holding include/hip/hip_runtime.h): g++ compiles the HIP
source as C++17 and links TBB. g++ has no `<<<...>>>`, so for HIP-CPU launches are written as
hipLaunchKernelGGL and `extern __shared__` arrays as HIP_DYNAMIC_SHARED. HIP-CPU lacks some of HIP's runtime
(hipDeviceGetAttribute, hipOccupancy*, __any_sync...): opscope's answers for the CPU, hip_cpu/hip_cpu_gaps.h in
this package, are force-included in every unit; $OPSCOPE_HIP_CPU_EXTRA may name more headers to force-include.
The gaps header (HIP-CPU's headers in it) is precompiled once and kept in $OPSCOPE_HOME/hip-cpu-pch (pch.py).
A program is each source with a `main`, linked with the other sources in its folder when it is the folder's only
main (simpleCallback.cu + multithreading.cpp), else with those that share its name's start
(simpleAtomicIntrinsics.cu + simpleAtomicIntrinsics_cpu.cpp).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from opscope.runtime.errors import UsageError
from opscope.runtime.home import opscope_home

from .c_rewrite import rewrite_c
from .c_scan import SUFFIXES, blank
from .files import Skip, read_source
from .pch import precompiled
from .rules import default_table
from .scan import source_files

ENV = "OPSCOPE_HIP_CPU"
EXTRA = "OPSCOPE_HIP_CPU_EXTRA"
GAPS = Path(__file__).with_name("hip_cpu") / "hip_cpu_gaps.h"
_MAIN = re.compile(r"\bint\s+main\s*\(")
_UNITS = (".cu", ".cpp", ".cc", ".cxx", ".c")


@dataclass
class Program:
    source: str
    built: bool
    error: str = ""                 # the compiler's and linker's output, whole
    returncode: int | None = None   # when run
    output: str = ""


@dataclass
class CompileResult:
    compiler: str
    programs: list[Program] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.built and p.returncode in (None, 0) for p in self.programs)


def find_compiler() -> tuple[str, list[str]]:
    """(what it is, the command before the sources), or UsageError when neither is there."""
    hipcc = shutil.which("hipcc")
    if hipcc:
        return "hipcc", [hipcc, "-O1"]
    root = os.environ.get(ENV, "").strip()
    if root and Path(root, "include", "hip", "hip_runtime.h").is_file():
        gxx = shutil.which("g++")
        if gxx is None:
            raise UsageError(f"${ENV} is set but g++ is not on PATH; install g++ (and libtbb-dev) to compile")
        cmd = [gxx, "-std=c++17", "-O1", f"-I{Path(root, 'include')}", "-include", str(GAPS)]
        for extra in filter(None, os.environ.get(EXTRA, "").split(os.pathsep)):
            cmd += ["-include", extra]
        return "HIP-CPU (g++ -std=c++17, TBB)", cmd
    if root:
        raise UsageError(f"${ENV}={root}: no include/hip/hip_runtime.h there; point it at HIP-CPU's folder")
    raise UsageError(f"no HIP compiler: put ROCm's hipcc on PATH, or set ${ENV} to a HIP-CPU checkout "
                     "(github.com/ROCm/HIP-CPU; needs g++ and libtbb-dev)")


def compile_tree(path: str | Path, *, run: bool = False, args: dict[str, list[str]] | None = None,
                 timeout: float = 300) -> CompileResult:
    """Rewrite every C/C++/CUDA file under `path` to HIP, then build (and with `run`, run) each program.
    `args`: program source name -> its command-line arguments."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{path} does not exist: give a folder of CUDA sources")
    name, cmd = find_compiler()
    launch = "keep" if name == "hipcc" else "ggl"
    table = default_table()
    result = CompileResult(name)
    with tempfile.TemporaryDirectory(prefix="opscope-hip-") as tmp:
        out = Path(tmp)
        base = root if root.is_dir() else root.parent
        written = []
        for p in source_files(root):
            if not p.name.endswith(SUFFIXES):
                continue
            try:
                text = read_source(p, 8 * 1024 * 1024, follow=p == root).decode("utf-8", errors="surrogateescape")
            except Skip:
                continue
            rel = p.relative_to(base)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(rewrite_c(str(rel), text, table, launch).after.encode("utf-8", "surrogateescape"))
            written.append(out / rel)
        folders = sorted({f.parent for f in written})
        includes = [f"-I{d}" for d in folders]
        jobs = []
        for unit in written:
            if unit.suffix not in _UNITS or not _MAIN.search(blank(unit.read_text(errors="replace"))):
                continue
            units = [f for f in written if f.parent == unit.parent and f.suffix in _UNITS]
            mains = [f for f in units if _MAIN.search(blank(f.read_text(errors="replace")))]
            # a folder with one main is one program; in a folder of several, a unit joins the main its name starts with
            partners = [f for f in units if f not in mains and (len(mains) == 1 or f.stem.startswith(unit.stem + "_"))]
            exe = unit.with_suffix(".bin")
            lang = ["-x", "c++"] if name != "hipcc" else []
            rest = [*includes, *lang, str(unit), *[str(f) for f in partners],
                    *(["-x", "none"] if lang else []), "-o", str(exe)]
            if name != "hipcc":
                rest += ["-ltbb", "-lpthread"]
            prog = Program(unit.relative_to(out).as_posix(), False)
            result.programs.append(prog)
            jobs.append((prog, rest, exe, (args or {}).get(unit.name, [])))
        if jobs and name != "hipcc":
            cmd = _with_precompiled_gaps(cmd, timeout)
        # programs build one per core: g++ on HIP-CPU's headers takes seconds of CPU a unit even precompiled
        with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            list(pool.map(lambda job: _build(job[0], [*cmd, *job[1]], *job[2:], run=run, timeout=timeout), jobs))
    return result


def _with_precompiled_gaps(cmd: list[str], timeout: float) -> list[str]:
    """`cmd` force-including a precompiled copy of the gaps header (HIP-CPU's headers in it) when one can be had."""
    i = cmd.index(str(GAPS))
    pch = precompiled(cmd[:i - 1], GAPS, opscope_home() / "hip-cpu-pch", timeout=timeout)
    return cmd if pch is None else [*cmd[:i], str(pch), *cmd[i + 1:]]


def _build(prog: Program, build: list[str], exe: Path, argv: list[str], *, run: bool, timeout: float) -> None:
    try:
        r = subprocess.run(build, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        prog.error = f"the compiler ran past {timeout:g} s"
        return
    if r.returncode != 0:
        # whole: a linker's undefined symbols and a compiler's notes are on lines without "error"
        prog.error = (r.stderr + r.stdout).strip() or f"the compiler exited {r.returncode}"
        return
    prog.built = True
    if run:
        try:
            ran = subprocess.run([str(exe), *argv], capture_output=True, text=True, errors="replace",
                                 timeout=timeout, cwd=exe.parent)
            prog.returncode, prog.output = ran.returncode, ran.stdout + ran.stderr
        except subprocess.TimeoutExpired:
            prog.returncode, prog.output = -1, f"ran past {timeout:g} s"
