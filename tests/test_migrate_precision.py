"""`migrate scan` and `apply` on C/C++ flag and rename only CUDA's own names (issue 40): a user's identifiers that
contain "cuda" (apex's cuda_layer_norm, cuWelfordOnlineSum), include guards, macros the file defines and
TORCH_LIBRARY_IMPL for CPU are theirs; the status enums of cuRAND, cuSPARSE, cuSOLVER and cuFFT are renamed as
hipify renames them; the driver API's error calls keep their two-argument form.

Scan precision and recall on real trees, against hand-labelled truth (issue 40 asks >= 0.95 each): apex's
extensions (C++, CUDA and the Python that loads them), Megatron-LM's RNG tracking and minGPT's trainer -- code
full of user identifiers containing "cuda" (fused_layer_norm_cuda, get_cuda_rng_tracker, multi_tensor_scale_cuda).

Material nobody here wrote: six sources and one Python module of NVIDIA's apex (tests/data/apex, BSD-3-Clause),
Megatron-LM's megatron/core/tensor_parallel/random.py (tests/data/megatron, its LICENSE) and three modules of
minGPT (tests/data/mingpt, MIT)."""
import re
from pathlib import Path

import pytest

from opscope.app.migrate.c_rewrite import rewrite_c
from opscope.app.migrate.c_scan import blank, scan_c
from opscope.app.migrate.rules import load_table
from opscope.app.migrate.scan import scan_path

DATA = Path(__file__).with_name("data")
APEX = DATA / "apex"
TABLE = load_table()
# every function apex defines in these files: its own code, whatever the name looks like
_DEF = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:static\s+|inline\s+|__device__\s+|__global__\s+|__host__\s+|"
                  r"__forceinline__\s+)*[\w:<>,\s\*&]+?\b(\w+)\s*\(", re.M)


def _defined(code: str) -> set[str]:
    names = set()
    for m in _DEF.finditer(code):
        end = code.find("{", m.end())
        semi = code.find(";", m.end())
        if end != -1 and (semi == -1 or end < semi) and m.group(1) not in ("if", "for", "while", "switch", "return"):
            names.add(m.group(1))
    return names


@pytest.mark.parametrize("name", sorted(p.name for p in APEX.glob("*.c*")))
def test_apex_own_functions_are_never_flagged_or_renamed(name):
    text = (APEX / name).read_text()
    own = {n for n in _defined(blank(text)) if "cu" in n.lower()}
    findings = scan_c(name, text, TABLE)
    flagged = {f.api for f in findings}
    assert not own & flagged, sorted(own & flagged)
    after = rewrite_c(name, text, TABLE).after
    for n in own:
        assert re.search(rf"\b{n}\b", after), f"{n} was renamed"
    # amp_C_frontend.cpp only declares apex's *_cuda functions and binds them: no CUDA of its own
    assert bool(findings) != (name == "amp_C_frontend.cpp"), findings


def test_the_cuda_named_user_functions_of_apex_are_what_the_check_above_protects():
    """The check is no test unless apex really defines such names here (it does: these would be caught by a
    `cuda*` or `cu*` glob)."""
    text = blank((APEX / "layer_norm_cuda.cpp").read_text() + (APEX / "layer_norm_cuda_kernel.cu").read_text())
    assert {"cuda_layer_norm", "cuda_rms_norm", "cuWelfordOnlineSum", "cuApplyLayerNorm"} <= _defined(text)


SNIPPET = '''#ifndef CUBLAS_COMMON_H
#define CUBLAS_COMMON_H
#define CUDA_CHECK(x) x
#include <cuda_runtime.h>
int cuda_device = 0;
TORCH_LIBRARY_IMPL(ext, CPU, m) { }
TORCH_LIBRARY_IMPL(ext, CUDA, m) { }
static const char *_cudaGetErrorEnum(CUresult error) { const char *s; cuGetErrorName(error, &s); return s; }
void f() {
  CUDA_CHECK(cudaSetDevice(cuda_device));
  curandStatus_t a = CURAND_STATUS_SUCCESS; cusparseStatus_t b = CUSPARSE_STATUS_SUCCESS;
  cufftResult c = CUFFT_SUCCESS; cusolverStatus_t d = CUSOLVER_STATUS_SUCCESS;
}
#endif
'''


def test_user_names_guards_and_cpu_registrations_are_not_cuda_apis():
    flagged = {(f.line, f.api) for f in scan_c("a.cu", SNIPPET, TABLE)}
    names = {api for _, api in flagged}
    assert not {"CUBLAS_COMMON_H", "CUDA_CHECK", "cuda_device"} & names, names
    assert (7, "TORCH_LIBRARY_IMPL") in flagged and (6, "TORCH_LIBRARY_IMPL") not in flagged
    assert {"cudaSetDevice", "CUresult", "cuGetErrorName"} <= names


def test_library_status_enums_and_driver_error_calls_are_renamed_as_hipify_does():
    after = rewrite_c("a.cu", SNIPPET, TABLE).after
    for cuda, hip in [("curandStatus_t", "hiprandStatus_t"), ("CURAND_STATUS_SUCCESS", "HIPRAND_STATUS_SUCCESS"),
                      ("cusparseStatus_t", "hipsparseStatus_t"), ("CUSPARSE_STATUS_SUCCESS", "HIPSPARSE_STATUS_SUCCESS"),
                      ("cufftResult", "hipfftResult"), ("CUFFT_SUCCESS", "HIPFFT_SUCCESS"),
                      ("cusolverStatus_t", "hipsolverStatus_t"), ("CUSOLVER_STATUS_SUCCESS", "HIPSOLVER_STATUS_SUCCESS"),
                      ("CUresult", "hipError_t"), ("cuGetErrorName", "hipDrvGetErrorName"),
                      ("cudaSetDevice", "hipSetDevice")]:
        assert hip in after and not re.search(rf"\b{cuda}\b", after), (cuda, hip)
    for kept in ("CUBLAS_COMMON_H", "CUDA_CHECK", "cuda_device"):
        assert re.search(rf"\b{kept}\b", after), kept
    assert "hipGetErrorName" not in after      # one argument: the driver's (CUresult, const char**) form is hipDrv*


# Hand-labelled truth, read line by line. Python: the lines that, as written, use CUDA -- a torch.cuda API, a CUDA
# device value (a "cuda" string, or a variable holding one where it is used), a CUDA-only library (apex). Imports of
# torch.cuda names are not labelled (importing runs nothing on CUDA; their uses are), nor are the users' own names
# (fused_layer_norm_cuda, _get_cuda_rng_state, get_cuda_rng_tracker, megatron.core.transformer.cuda_graphs),
# comments and docstrings.
PYTHON_TRUTH = {
    "apex/fused_layer_norm.py": {10,                                  # from apex._autocast_utils import ...
                                 674, 683, 694, 700, 709, 720,        # torch.amp.autocast("cuda", enabled=False)
                                 820, 934, 984, 1026},                # `or not input.is_cuda`
    "megatron/random.py": {105,                                       # device=... = "cuda" default
                           118,                                       # torch.cuda.random.get_rng_state
                           120, 174,                                  # torch.cuda's _lazy_init(), _lazy_call(cb)
                           122, 158,                                  # torch.device(device): a str, "cuda" by default
                           124, 156, 160,                             # torch.device("cuda"...)
                           127, 165, 129, 166,                        # current_device(), default_generators[idx]
                           147, 151,                                  # _C._cuda_setRNGState
                           150,                                       # with device_ctx_manager(device): torch.cuda.device
                           245,                                       # torch.cuda.CUDAGraph
                           303, 305, 306, 502},                       # CudaRNGStatesTracker.add; manual_seed
    "mingpt/trainer.py": {40,                                         # 'cuda' if torch.cuda.is_available()
                          43, 89},                                    # .to(self.device): that 'cuda'
    "mingpt/utils.py": {17},                                          # torch.cuda.manual_seed_all
    "mingpt/model.py": set(),                                         # device = idx.device: whatever the input's
}
# C/C++/CUDA: the CUDA names each file uses (a kernel definition is "__global__", a launch "<<<>>>"). Not CUDA's:
# apex's cuda_layer_norm, cuWelfordOnlineSum, cuApplyLayerNorm..., multi_tensor_*_cuda, CHECK_CUDA (its macro),
# rsqrt (its template), WARP_SHFL (PyTorch's portable macro), __restrict__ (every C++ compiler's).
_KERNEL = {"__device__", "__global__", "__shared__", "__syncthreads", "blockDim", "blockIdx", "<<<>>>", "dim3",
           "gridDim", "threadIdx"}
C_TRUTH = {
    "apex/layer_norm_cuda.cpp": {".is_cuda()"},
    "apex/layer_norm_cuda_kernel.cu": _KERNEL | {
        "#include ATen/cuda/CUDAContext.h", "#include ATen/cuda/DeviceUtils.cuh", "#include cuda.h",
        "#include cuda_runtime.h", "__half2", "__half22float2", "at::cuda::getCurrentCUDAStream",
        "at::cuda::getCurrentDeviceProperties", "rsqrtf"},
    "apex/welford.cu": _KERNEL | {
        "#include ATen/cuda/CUDAContext.h", "#include cuda.h", "#include cuda_runtime.h", "__host__",
        "__forceinline__", "__shfl_down_sync", "__clz", "__threadfence", "atomicAdd", "at::cuda::getCurrentCUDAStream"},
    "apex/amp_C_frontend.cpp": set(),
    "apex/multi_tensor_apply.cuh": {
        "#include ATen/cuda/CUDAContext.h", "#include ATen/cuda/Exceptions.h", "#include c10/cuda/CUDAGuard.h",
        "__global__", "<<<>>>", "at::cuda::OptionalCUDAGuard", "at::cuda::getCurrentCUDAStream", "at::kCUDA",
        "cudaGetLastError", "AT_CUDA_CHECK"},
    "apex/multi_tensor_scale_kernel.cu": {
        "#include ATen/cuda/CUDAContext.h", "#include ATen/cuda/Exceptions.h", "__device__", "__forceinline__",
        "blockDim", "blockIdx", "threadIdx", "cudaGetLastError", "AT_CUDA_CHECK"},
}


def _c_name(api: str) -> str:
    return "__global__" if api.startswith("__global__ ") else "<<<>>>" if api.endswith("<<<>>>") else api


def _precision_recall(found: set, truth: set) -> tuple[float, float]:
    hit = len(found & truth)
    return (hit / len(found) if found else 1.0), (hit / len(truth) if truth else 1.0)


def test_scan_precision_and_recall_on_real_python_and_c_trees():
    found_py, found_c = set(), set()
    for folder in ("apex", "megatron", "mingpt"):
        for f in scan_path(DATA / folder).findings:
            key = f"{folder}/{f.file}"
            if key in PYTHON_TRUTH and f.language == "python":
                found_py.add((key, f.line))
            elif key in C_TRUTH and f.language == "c":
                found_c.add((key, _c_name(f.api)))
    truth_py = {(k, line) for k, lines in PYTHON_TRUTH.items() for line in lines}
    truth_c = {(k, name) for k, names in C_TRUTH.items() for name in names}
    report = []
    for lang, found, truth in (("python", found_py, truth_py), ("c", found_c, truth_c)):
        precision, recall = _precision_recall(found, truth)
        report.append(f"{lang}: precision {precision:.3f} recall {recall:.3f} ({len(truth)} labelled); "
                      f"wrongly flagged {sorted(found - truth)[:8]}, missed {sorted(truth - found)[:8]}")
        assert precision >= 0.95 and recall >= 0.95, report[-1]
    print("\n".join(report))
    assert len(truth_py) >= 35 and len(truth_c) >= 55       # the labels are what the thresholds stand on
