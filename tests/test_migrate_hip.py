"""`migrate apply` rewrites CUDA C/C++ to HIP (issue 29): the table agrees with hipify-perl's own names
(tests/data/hipify: a subset of bin/hipify-perl, MIT), real cuda-samples files (tests/data/cuda-samples, NVIDIA's
BSD license) come out with every CUDA name rewritten or reported, no call is half rewritten, and three rewritten
samples compile with HIP-CPU (tests/data/hip-cpu, MIT) and g++ and pass their own result checks."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from opscope.app.migrate.c_rewrite import _CUDA_WORD, hip_name, rewrite_c
from opscope.app.migrate.c_scan import blank, scan_c
from opscope.app.migrate.rules import default_table

DATA = Path(__file__).with_name("data")
SAMPLES = DATA / "cuda-samples"
INTRO = "Samples/0_Introduction"
# where opscope's table chooses differently from hipify-perl, on purpose
KNOWN = {"cudnn.h": "MIOpen (miopen/miopen.h), as issue 29 asks; hipify-perl names the retired hipDNN",
         "cublasLt.h": "hipblaslt/hipblaslt.h is where ROCm installs it; hipify-perl writes hipblaslt.h"}


def hipify_perl_names():
    rows = []
    for line in (DATA / "hipify" / "hipify_perl_subset.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            cuda, hip, kind = line.split(" ")
            rows.append((cuda, hip, kind))
    return rows


def _kind(k: str) -> str:
    return "include" if k.startswith("include") else "identifier" if k in ("type", "numeric_literal", "define") \
        else "call"


def test_table_agrees_with_hipify_perl():
    table = default_table()
    rows = hipify_perl_names()
    assert len(rows) > 700
    agree, differ, unmapped = [], [], []
    for cuda, hip, kind in rows:
        mine = hip_name(table, cuda, _kind(kind))
        (unmapped if mine is None else agree if mine == hip else differ).append((cuda, hip, mine))
    assert [d for d in differ if d[0] not in KNOWN] == []
    print(f"hipify-perl subset: {len(agree)} of {len(rows)} names agree ({100 * len(agree) / len(rows):.1f}%), "
          f"{len(unmapped)} reported as unmapped, {len(differ)} known differences")
    assert len(agree) / len(rows) > 0.8
    # current names, not the deprecated ones (hipMallocHost / hipFreeHost)
    assert hip_name(table, "cudaMallocHost", "call") == "hipHostMalloc"
    assert hip_name(table, "cudaFreeHost", "call") == "hipHostFree"


def test_apply_rewrites_the_cuda_samples_and_reports_what_it_cannot(tmp_path, cli):
    tree = tmp_path / "samples"
    shutil.copytree(SAMPLES, tree)
    r = cli("migrate", "apply", str(tree), "--write", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    reported = {(f["file"], f["line"]) for f in doc["unmapped"]}
    table = default_table()
    left = []
    for p in sorted(tree.rglob("*")):
        if p.suffix not in (".cu", ".cpp", ".h", ".cuh") or p.name.endswith(".orig"):
            continue
        rel = p.relative_to(tree).as_posix()
        # the runtime header apply adds (as hipify does) shifts lines; unmapped names are reported at the original's
        code = blank(p.read_text().replace('#include "hip/hip_runtime.h"\n', "", 1))
        for m in re.finditer(r"\b\w+\b", code):
            word = m.group(0)
            if _CUDA_WORD.fullmatch(word) and hip_name(table, word, "call") != word:
                line = code.count("\n", 0, m.start()) + 1
                if (rel, line) not in reported:
                    left.append((rel, line, word))
    assert left == [], left[:10]                     # every CUDA name left in the code was reported
    vec = (tree / INTRO / "vectorAdd" / "vectorAdd.cu").read_text()
    assert "#include <hip/hip_runtime.h>" in vec and "hipMalloc((void **)&d_A, size)" in vec
    # a unit using the runtime or kernel syntax without naming CUDA's header gets HIP's, as hipify adds it
    helper = (tree / "Common" / "helper_cuda.h").read_text()
    assert '#include "hip/hip_runtime.h"\n#ifndef COMMON_HELPER_CUDA_H_' in helper
    assert "hip_runtime" not in (tree / "Common" / "helper_string.h").read_text()
    kernel = tree / INTRO / "simpleAtomicIntrinsics" / "simpleAtomicIntrinsics_kernel.cuh"
    assert kernel.read_text().count("hip/hip_runtime.h") == 1
    assert "vectorAdd<<<blocksPerGrid, threadsPerBlock>>>(d_A, d_B, d_C, numElements);" in vec   # HIP takes it
    assert "dim3 threads(block_size, block_size);" in (tree / INTRO / "matrixMul" / "matrixMul.cu").read_text()
    orig = f"{INTRO}/vectorAdd/vectorAdd.cu"
    assert (tree / (orig + ".orig")).read_text() == (SAMPLES / orig).read_text()
    again = cli("migrate", "apply", str(tree), "--json")         # a second apply changes nothing
    assert [f for f in json.loads(again.stdout)["files"] if not f["file"].endswith(".orig")] == []


ISSUE_NAMES = """#include <cuda_profiler_api.h>
#include <torch/library.h>
__global__ void vote(int *out) {
  out[0] = __any_sync(0xffffffff, threadIdx.x > 3) + __all_sync(0xffffffff, 1);
}
TORCH_LIBRARY_IMPL(myops, CUDA, m) { m.impl("op", &op); }
void host(float **p) {
  dim3 grid(2, 2);
  cudaMallocHost((void **)p, 64);
  cudaHostAlloc((void **)p, 64, cudaHostAllocMapped);
  cudaFreeHost(*p);
  bool on = at::DeviceType::CUDA == c10::DeviceType::CUDA;
  int x = cudaDeviceGetAttribute(&v, cudaDevAttrMaxTexture1DWidth, cudaGetDevice(&d));
  cudaProfilerStart();
}
"""


def test_issue_names_are_found_and_rewritten_whole():
    table = default_table()
    found = {f.api for f in scan_c("k.cu", ISSUE_NAMES, table)}
    assert {"#include cuda_profiler_api.h", "__any_sync", "__all_sync", "TORCH_LIBRARY_IMPL", "dim3",
            "at::DeviceType::CUDA", "cudaHostAllocMapped"} <= found
    cr = rewrite_c("k.cu", ISSUE_NAMES, table)
    after = cr.after
    assert "#include <hip/hip_runtime_api.h>" in after
    assert "__any_sync(0xffffffff, threadIdx.x > 3) + __all_sync(0xffffffff, 1)" in after
    assert "TORCH_LIBRARY_IMPL(myops, CUDA, m)" in after and "dim3 grid(2, 2);" in after
    assert "hipHostMalloc((void **)p, 64);" in after and "hipHostFree(*p);" in after
    assert "hipHostAlloc((void **)p, 64, hipHostMallocMapped);" in after and "hipProfilerStart();" in after
    # a call holding a name with no HIP equivalent is left whole -- its cudaGetDevice too -- and reported
    assert "cudaDeviceGetAttribute(&v, cudaDevAttrMaxTexture1DWidth, cudaGetDevice(&d));" in after
    assert [f.api for f in cr.unmapped] == ["cudaDevAttrMaxTexture1DWidth"]


@pytest.mark.multiprocess
def test_text_and_html_reports_show_the_hip_and_sycl_names(tmp_path, cli):
    (tmp_path / "k.cu").write_text("void f(float **p) { cudaMallocHost((void **)p, 4); }\n")
    r = cli("migrate", "scan", str(tmp_path), env={"COLUMNS": "250"})
    assert "HIP: hipHostMalloc" in r.stdout and "SYCL:" in r.stdout
    out = tmp_path / "r.html"
    cli("migrate", "scan", str(tmp_path), "--html", "-o", str(out))
    assert "<th>HIP</th>" in out.read_text() and "<code>hipHostMalloc</code>" in out.read_text()


# sample -> (its arguments, what it prints when its own check passes)
PROGRAMS = {"vectorAdd.cu": ([], "Test PASSED"),
            "matrixMul.cu": (["-wA=64", "-hA=64", "-wB=64", "-hB=64"], "Result = PASS"),
            "asyncAPI.cu": ([], "time spent executing by the GPU")}   # its check (correct_output) is its exit code


@pytest.mark.slow
@pytest.mark.multiprocess
def test_three_rewritten_samples_compile_with_hip_cpu_and_pass_their_checks(tmp_path, cli):
    assert shutil.which("g++"), "g++ is needed (apt-get install g++)"
    assert Path("/usr/include/tbb").is_dir() or Path("/usr/include/oneapi/tbb").is_dir(), \
        "HIP-CPU needs TBB: apt-get install libtbb-dev"
    tree = tmp_path / "samples"
    (tree / "Common").mkdir(parents=True)
    for name in PROGRAMS:
        shutil.copy(SAMPLES / INTRO / Path(name).stem / name, tree / name)
    for h in (SAMPLES / "Common").iterdir():
        shutil.copy(h, tree / "Common" / h.name)
    env = {"OPSCOPE_HIP_CPU": str(DATA / "hip-cpu")}     # HIP-CPU's gaps: opscope's own header, by default
    from opscope.app.migrate.compile_check import compile_tree
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = compile_tree(tree, run=True, args={k: v[0] for k, v in PROGRAMS.items()})
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.compiler.startswith("HIP-CPU")
    got = {Path(p.source).name: p for p in res.programs}
    assert sorted(got) == sorted(PROGRAMS)
    for name, (_, passed) in PROGRAMS.items():
        p = got[name]
        assert p.built, f"{name}: {p.error}"
        assert p.returncode == 0 and passed in p.output, f"{name}: {p.output[-1500:]}"
    r = cli("migrate", "check", "--compile", str(tmp_path / "none"), env=env)
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.multiprocess
def test_check_compile_says_what_to_install_without_a_compiler(tmp_path, cli):
    (tmp_path / "k.cu").write_text("int main() { return 0; }\n")
    env = {"OPSCOPE_HIP_CPU": "", "PATH": "/usr/bin:/bin"}
    if shutil.which("hipcc", path=env["PATH"]):
        pytest.skip("hipcc is installed here")
    r = cli("migrate", "check", "--compile", str(tmp_path), env=env)
    assert r.returncode == 2 and "no HIP compiler" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("migrate", "check")
    assert r.returncode == 2 and "--compile TREE" in r.stderr


def _uses_pch(include: Path, unit: Path, *flags: str) -> str:
    """g++'s -H report of what a unit read: a line `! X.gch` when the precompiled header was loaded."""
    r = subprocess.run(["g++", *flags, "-include", str(include), "-H", "-fsyntax-only", str(unit)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.multiprocess
def test_precompiled_header_is_reused_and_never_used_stale_or_tampered(tmp_path):
    """`migrate check --compile` precompiles HIP-CPU's headers with opscope's gaps header once (app/migrate/pch.py);
    here on a tiny header, so the cache's rules are checked in a fraction of a second of g++."""
    if not shutil.which("g++"):
        pytest.skip("g++ is not installed")
    from opscope.app.migrate.pch import precompiled
    (tmp_path / "inc").mkdir()
    dep = tmp_path / "inc" / "dep.h"
    dep.write_text("#define VALUE 1\n")
    header = tmp_path / "gaps.h"
    header.write_text("#pragma once\n#include <dep.h>\n#include <vector>\n")
    unit = tmp_path / "u.cpp"
    unit.write_text("static_assert(VALUE == 1);\nint main() { std::vector<int> v; return int(v.size()); }\n")
    flags = ["g++", "-std=c++17", "-O1", f"-I{tmp_path / 'inc'}"]
    cache = tmp_path / "cache"
    first = precompiled(flags, header, cache)
    gch = first.with_name(first.name + ".gch")
    assert first.parent.parent == cache and first.read_text() == header.read_text() and gch.is_file()
    assert f"! {gch}" in _uses_pch(first, unit, *flags[1:])
    built = gch.stat().st_mtime_ns
    assert precompiled(flags, header, cache) == first and gch.stat().st_mtime_ns == built   # reused, not rebuilt
    # other flags are another key: the -O0 build never meets the -O1 one
    assert precompiled([*flags[:2], "-O0", flags[3]], header, cache).parent != first.parent
    # a header it read has changed (TBB, HIP-CPU updated): rebuilt, the unit sees the new one
    dep.write_text("#define VALUE 2\n")
    unit.write_text(unit.read_text().replace("VALUE == 1", "VALUE == 2"))
    again = precompiled(flags, header, cache)
    assert again == first and gch.stat().st_mtime_ns != built
    assert f"! {gch}" in _uses_pch(again, unit, *flags[1:])
    # a .gch swapped or cut short: never used, built again
    gch.write_bytes(b"gpch" + b"\0" * 64)
    assert precompiled(flags, header, cache) == first and gch.read_bytes()[:4] == b"gpch" and gch.stat().st_size > 68
    # an entry others can write may have been swapped by them: built again, ours alone
    os.chmod(gch, 0o666)
    assert precompiled(flags, header, cache) == first and gch.stat().st_mode & 0o077 == 0
    # a manifest that names a FIFO as a file g++ read, or that is too big: checked, never trusted -- rebuilt, no hang
    manifest = first.parent / "manifest.json"
    os.mkfifo(tmp_path / "fifo")
    for case in ("fifo", "too big"):
        # the entry as last built, with this one change: the big one is right in all else, so only its size refuses it
        doc = json.loads(manifest.read_text())
        if case == "fifo":
            doc["read"][str(tmp_path / "fifo")] = "0" * 64
        else:
            doc["pad"] = "x" * (5 << 20)
        manifest.write_text(json.dumps(doc))
        done = []
        t = threading.Thread(target=lambda: done.append(precompiled(flags, header, cache)), daemon=True)
        t.start()
        t.join(120)
        assert done == [first] and len(manifest.read_text()) < 1 << 20, f"a tampered manifest ({case}) was trusted"
    # the header itself changed: another key
    header.write_text(header.read_text() + "#include <map>\n")
    assert precompiled(flags, header, cache).parent != first.parent
    # a header g++ cannot precompile: None, and the caller includes the header as text
    header.write_text("#include <no_such_header.h>\n")
    assert precompiled(flags, header, cache) is None
