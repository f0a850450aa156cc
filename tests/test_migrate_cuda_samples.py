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
# why the others fail (measured at cuda-samples c94ff36, HIP-CPU as vendored, opscope's hip_cpu_gaps.h)
KNOWN_FAILURES = {
    "Samples/0_Introduction/simpleAssert": "a failed assert in a kernel is the host's assert on HIP-CPU: it aborts "
                                           "the process, where CUDA and HIP fail the launch with cudaErrorAssert, "
                                           "which the sample checks",
    "Samples/0_Introduction/simpleAttributes": "L2 access-policy windows (cudaStreamSetAttribute, "
                                               "cudaStreamAttrValue, cudaCtxResetPersistingL2Cache) have no HIP "
                                               "equivalent (hipify leaves them too)",
}
# what each of them shows when it fails for that reason
EVIDENCE = {"Samples/0_Introduction/simpleAssert": r"Assertion `gtid < N' failed",
            "Samples/0_Introduction/simpleAttributes": r"hipStreamSetAttribute\S* was not declared"}
# vendored beside the corpus for the rewrite's tests (tests/test_migrate_hip.py), never built here
NOT_BUILT = {"Samples/2_Concepts_and_Techniques/reduction"}


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
    vendored = {p.parent.relative_to(SAMPLES).as_posix() for p in (SAMPLES / "Samples").rglob("*.cu*")}
    assert kept == sorted(vendored - NOT_BUILT)
    assert {rows[name] for name in NOT_BUILT} == {"cooperative groups"}
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
    for name, why in corpus().items():
        if why == RUNTIME_ONLY:
            shutil.copytree(SAMPLES / name, tree / name)
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
    failed = {name: (p["error"] if not p["built"] else f"exit {p['returncode']}: {p['output']}")
              for name, p in programs.items() if not passed(p["returncode"], p["output"])}
    ok = len(programs) - len(failed)
    print(f"\n{ok} of {len(programs)} runtime-API-only cuda-samples build with HIP-CPU and pass their own checks")
    for name, why in failed.items():
        print(f"--- {name} ({KNOWN_FAILURES.get(name, 'NEW')}):\n{why[-1200:]}")
    # issue 40 asks 80% (16 of 20); 18 pass. A failure not named here is a regression, one that passes now is news
    assert set(failed) == set(KNOWN_FAILURES), sorted(set(failed) ^ set(KNOWN_FAILURES))
    assert ok == 18
    for name, evidence in EVIDENCE.items():
        assert re.search(evidence, failed[name]), (name, failed[name])
