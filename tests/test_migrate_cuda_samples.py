"""`migrate apply --write` then `migrate check --compile --run` on a corpus nobody picked for passing (issue 40):
every program of cuda-samples' Samples/0_Introduction and Samples/2_Concepts_and_Techniques that uses the CUDA
runtime API only, by the mechanical rule in tests/data/cuda-samples/classify.py (its verdicts: corpus.txt), built
with HIP-CPU (tests/data/hip-cpu) and g++, each judged by its own check: exit status 0 (cuda-samples exit
EXIT_FAILURE on a wrong result, EXIT_WAIVED=2 when the device lacks something) and no FAILED or waiving line."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).with_name("data")
SAMPLES = DATA / "cuda-samples"
RUNTIME_ONLY = "runtime API only"
ENV = {"OPSCOPE_HIP_CPU": str(DATA / "hip-cpu"), "OPSCOPE_HIP_CPU_EXTRA": ""}
# the samples' own options for a smaller problem where the default takes minutes of fibers on a CPU
ARGS = {"matrixMul.cu": ["-wA=64", "-hA=64", "-wB=64", "-hB=64"]}
# why the others fail today (measured at cuda-samples c94ff36, HIP-CPU as vendored)
KNOWN_FAILURES = {
    "Samples/0_Introduction/fp16ScalarProduct": "HIP-CPU's half2 members are proxies: (float)h2.x needs two "
                                                "conversions",
    "Samples/0_Introduction/simpleAssert": "a device assert aborts the CPU process; the sample expects the launch to "
                                           "return cudaErrorAssert",
    "Samples/0_Introduction/simpleAttributes": "HIP-CPU's hipDeviceProp_t has no persistingL2CacheMaxSize, and no "
                                               "hipStreamSetAttribute (L2 access-policy windows)",
    "Samples/0_Introduction/simpleMultiCopy": "HIP-CPU's hipDeviceProp_t has no asyncEngineCount",
    "Samples/0_Introduction/simpleVoteIntrinsics": "the sample assumes 32-lane warps; HIP-CPU's warpSize is 64 (as "
                                                   "AMD GPUs')",
    "Samples/0_Introduction/simpleZeroCopy": "CUDART_VERSION is undefined outside CUDA, and the sample's #else branch "
                                             "does not compile (', ,' in a fprintf)",
    "Samples/0_Introduction/systemWideAtomics": "HIP-CPU's hipDeviceProp_t has no managedMemory or "
                                                "pageableMemoryAccess",
}


def corpus() -> dict[str, str]:
    """program folder (Samples/...) -> "runtime API only" or why it is left out."""
    rows = [line.split("\t") for line in (SAMPLES / "corpus.txt").read_text().splitlines() if not line.startswith("#")]
    return dict(rows)


def passed(returncode: int | None, output: str) -> bool:
    return returncode == 0 and not re.search(r"FAIL|[Ww]aiv", output)


def test_the_corpus_is_every_runtime_only_program_of_the_two_folders():
    rows = corpus()
    assert len(rows) == 78                                   # every program folder of the two, at the vendored commit
    kept = sorted(name for name, why in rows.items() if why == RUNTIME_ONLY)
    vendored = sorted({p.parent.relative_to(SAMPLES).as_posix() for p in (SAMPLES / "Samples").rglob("*.cu*")})
    assert kept == vendored
    left = {why for why in rows.values() if why != RUNTIME_ONLY}
    assert {"driver API (cu* calls, cuda.h)", "textures or surfaces", "cooperative groups",
            "NVRTC (runtime compilation)"} <= left
    assert len(kept) == 20


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(3600)
def test_runtime_only_cuda_samples_build_and_pass_with_hip_cpu(tmp_path, cli):
    assert shutil.which("g++"), "g++ is needed (apt-get install g++)"
    assert Path("/usr/include/tbb").is_dir() or Path("/usr/include/oneapi/tbb").is_dir(), \
        "HIP-CPU needs TBB: apt-get install libtbb-dev"
    tree = tmp_path / "cuda-samples"
    shutil.copytree(SAMPLES / "Samples", tree / "Samples")
    shutil.copytree(SAMPLES / "Common", tree / "Common")
    r = cli("migrate", "apply", str(tree), "--write", "--json")
    assert r.returncode == 0, r.stderr
    for unit in tree.rglob("*.cu"):                           # every CUDA unit names HIP's runtime, as hipify does
        assert '#include "hip/hip_runtime.h"' in unit.read_text() or "<hip/hip_runtime.h>" in unit.read_text()
    # what HIP-CPU lacks comes with opscope (no OPSCOPE_HIP_CPU_EXTRA); check --compile --run is compile_tree
    from opscope.app.migrate.compile_check import compile_tree
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        res = compile_tree(tree, run=True, args=ARGS, timeout=900)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.compiler.startswith("HIP-CPU")
    programs = {str(Path(p.source).parent): p.__dict__ for p in res.programs}
    expected = sorted(name for name, why in corpus().items() if why == RUNTIME_ONLY)
    assert sorted(programs) == expected
    failed = {name: (p["error"][-1200:] if not p["built"] else f"exit {p['returncode']}: {p['output'][-600:]}")
              for name, p in programs.items() if not passed(p["returncode"], p["output"])}
    ok = len(programs) - len(failed)
    print(f"\n{ok} of {len(programs)} runtime-API-only cuda-samples build with HIP-CPU and pass their own checks")
    for name, why in failed.items():
        print(f"--- {name} ({KNOWN_FAILURES.get(name, 'NEW')}):\n{why}")
    # issue 40 asks 80% (16 of 20); today 13 pass. A failure not named here is a regression
    assert set(failed) <= set(KNOWN_FAILURES), sorted(set(failed) - set(KNOWN_FAILURES))
    assert ok >= 13
