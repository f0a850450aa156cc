"""Which cuda-samples programs use only the CUDA runtime API: a mechanical rule over each program's own sources.

    python tests/data/cuda-samples/classify.py PATH/TO/cuda-samples [--vendor]

Reads the git checkout at HEAD (no work tree needed), writes corpus.txt beside this file (one line per program of
Samples/0_Introduction and Samples/2_Concepts_and_Techniques: its folder, then "runtime API only" or the first rule
below that matches), and with --vendor copies the runtime-API-only programs' sources into Samples/ here.
The rules are checked in order on the program's .cu/.cuh/.cpp/.c/.h/.hpp files with comments removed; a program
matching none uses the runtime API only (plus Common/'s helpers). Not a judgement of what HIP-CPU runs: that is
the test's.
"""
import re
import subprocess
import sys
from pathlib import Path

FOLDERS = ("Samples/0_Introduction", "Samples/2_Concepts_and_Techniques")
RULES = [  # (reason, pattern): the first that matches names why a program is not runtime-API-only
    ("NVRTC (runtime compilation)", r"nvrtc"),
    ("driver API (cu* calls, cuda.h)",
     r"#include\s*[<\"]cuda\.h[>\"]|\bcu(?:Init|Ctx|Module|Mem|Device|Launch|Func|Stream|Event|LinkCreate"
     r"|GetProcAddress)\w*\s*\("),
    ("graphics interop (OpenGL, EGL, Vulkan, Direct3D)",
     r"#include\s*[<\"](?:GL/|EGL/|GLFW|vulkan|d3d1|cuda_gl_interop|cudaEGL|.*glut)"),
    ("MPI or OpenMP", r"mpi\.h|omp\.h|#pragma\s+omp"),
    ("textures or surfaces", r"cudaTextureObject_t|cudaSurfaceObject_t|\btexture\s*<|\bsurface\s*<|\btex[123]D"
                             r"|cudaArray"),
    ("CUDA graphs", r"cudaGraph"),
    ("cooperative groups", r"cooperative_groups"),
    ("libcu++ (cuda::barrier, cuda::pipeline)", r"#include\s*<cuda/"),
    ("CUDA libraries (cuBLAS, cuRAND, cuFFT, NPP, Thrust, CUB)", r"cublas|curand|cufft|npp|thrust/|cub/"),
    ("inline PTX", r"\basm\s*(?:volatile\s*)?\("),
    ("inter-process or peer-to-peer memory (several GPUs)", r"cudaIpc|PeerAccess|CanAccessPeer|cudaMemcpyPeer"),
]
SOURCES = (".cu", ".cuh", ".cpp", ".c", ".h", ".hpp")


def git(repo, *args, binary=False):
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, check=True).stdout
    return out if binary else out.decode("utf-8", "replace")


def classify(repo):
    rows = []
    for folder in FOLDERS:
        for name in git(repo, "ls-tree", "--name-only", "HEAD", folder + "/").split():
            if not git(repo, "ls-tree", "-d", "HEAD", name).strip():
                continue
            files = [f for f in git(repo, "ls-tree", "-r", "--name-only", "HEAD", name + "/").split()
                     if f.endswith(SOURCES)]
            text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", "\n".join(git(repo, "show", "HEAD:" + f) for f in files),
                          flags=re.S)
            rows.append((name, next((why for why, p in RULES if re.search(p, text)), None), files))
    return rows


def main(repo, vendor=False):
    here = Path(__file__).parent
    rows = classify(repo)
    commit = git(repo, "rev-parse", "HEAD").strip()
    lines = [f"# cuda-samples {commit}: written by classify.py (its rules say why a program is left out)"]
    lines += [f"{name}\t{why or 'runtime API only'}" for name, why, _ in rows]
    (here / "corpus.txt").write_text("\n".join(lines) + "\n")
    if vendor:
        for name, why, files in rows:
            for f in files if why is None else []:
                (here / f).parent.mkdir(parents=True, exist_ok=True)
                (here / f).write_bytes(git(repo, "show", "HEAD:" + f, binary=True))
    print(f"{sum(w is None for _, w, _ in rows)} of {len(rows)} programs use the runtime API only")


if __name__ == "__main__":
    main(sys.argv[1], "--vendor" in sys.argv)
