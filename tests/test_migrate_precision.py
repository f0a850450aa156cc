"""`migrate scan` and `apply` on C/C++ flag and rename only CUDA's own names (issue 40): a user's identifiers that
contain "cuda" (apex's cuda_layer_norm, cuWelfordOnlineSum), include guards, macros the file defines and
TORCH_LIBRARY_IMPL for CPU are theirs; the status enums of cuRAND, cuSPARSE, cuSOLVER and cuFFT are renamed as
hipify renames them; the driver API's error calls keep their two-argument form.

Material nobody here wrote: three sources of NVIDIA's apex (tests/data/apex, BSD-3-Clause)."""
import re
from pathlib import Path

import pytest

from opscope.app.migrate.c_rewrite import rewrite_c
from opscope.app.migrate.c_scan import blank, scan_c
from opscope.app.migrate.rules import load_table

APEX = Path(__file__).with_name("data") / "apex"
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
    assert findings, "the file uses CUDA: something must be found"


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
