// opscope test scaffold (not from HIP-CPU): HIP runtime calls that cuda-samples' helper_cuda.h uses and
// HIP-CPU does not implement yet, answered for the CPU. Force-included (g++ -include) after HIP-CPU's
// hip_runtime.h by tests/test_migrate_hip.py and `opscope migrate check --compile`; real HIP has them all.
#pragma once
#include <hip/hip_runtime.h>
#include <thread>

#ifndef hipDeviceAttributeComputeMode   // HIP-CPU has no hipDeviceAttribute_t at all
enum hipDeviceAttribute_t {
    hipDeviceAttributeComputeMode,
    hipDeviceAttributeComputeCapabilityMajor,
    hipDeviceAttributeComputeCapabilityMinor,
    hipDeviceAttributeMultiprocessorCount,
    hipDeviceAttributeClockRate,
    hipDeviceAttributeIntegrated,
};
enum hipComputeMode { hipComputeModeDefault = 0, hipComputeModeExclusive = 1, hipComputeModeProhibited = 2,
                      hipComputeModeExclusiveProcess = 3 };

inline hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int /*device*/) {
    switch (attr) {
    case hipDeviceAttributeComputeMode: *value = hipComputeModeDefault; break;
    case hipDeviceAttributeComputeCapabilityMajor: *value = 7; break;   // a version helper_cuda.h knows
    case hipDeviceAttributeComputeCapabilityMinor: *value = 0; break;
    case hipDeviceAttributeMultiprocessorCount: *value = int(std::thread::hardware_concurrency()); break;
    case hipDeviceAttributeClockRate: *value = 1000000; break;
    case hipDeviceAttributeIntegrated: *value = 1; break;
    }
    return hipSuccess;
}
inline hipError_t hipProfilerStart() { return hipSuccess; }
inline hipError_t hipProfilerStop() { return hipSuccess; }
inline hipError_t hipEventQuery(hipEvent_t e) { return hipEventSynchronize(e); }
#endif
