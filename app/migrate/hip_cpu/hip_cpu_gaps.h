// opscope's answers for what HIP has and HIP-CPU (github.com/ROCm/HIP-CPU) lacks, for the CPU: device attributes,
// int forms of enum and occupancy arguments, the *_sync warp intrinsics, CUDA's global min/max, half/half2.
// `opscope migrate check --compile` force-includes it (g++ -include) in every unit it builds with HIP-CPU;
// real HIP (hipcc) has all of these and never sees this file.
#pragma once
// NOTE: HIP-CPU declares hipDeviceProp_t `final`, and its struct lacks fields HIP's has (asyncEngineCount,
// managedMemory...); with `final` empty while its headers are read, the struct below can extend it. Those headers
// and the libstdc++/TBB ones they pull in use `final` only as a specifier, never as a name.
#define final
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#undef final
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <type_traits>

#ifndef hipDeviceAttributeComputeMode   // HIP-CPU has no hipDeviceAttribute_t at all
enum hipDeviceAttribute_t {
    hipDeviceAttributeComputeMode,
    hipDeviceAttributeComputeCapabilityMajor,
    hipDeviceAttributeComputeCapabilityMinor,
    hipDeviceAttributeMultiprocessorCount,
    hipDeviceAttributeClockRate,
    hipDeviceAttributeIntegrated,
    hipDeviceAttributeAsyncEngineCount,
    hipDeviceAttributeMemoryPoolsSupported,
    hipDeviceAttributeConcurrentManagedAccess,
    hipDeviceAttributePageableMemoryAccess,
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
    case hipDeviceAttributeAsyncEngineCount: *value = 1; break;
    case hipDeviceAttributeMemoryPoolsSupported: *value = 1; break;        // hipMallocAsync is hipMalloc below
    case hipDeviceAttributeConcurrentManagedAccess: *value = 1; break;     // host memory is the device's
    case hipDeviceAttributePageableMemoryAccess: *value = 1; break;
    }
    return hipSuccess;
}
inline hipError_t hipProfilerStart() { return hipSuccess; }
inline hipError_t hipProfilerStop() { return hipSuccess; }
inline hipError_t hipEventQuery(hipEvent_t e) { return hipEventSynchronize(e); }
#endif

#ifndef OPSCOPE_HIP_CPU_GAPS_2
#define OPSCOPE_HIP_CPU_GAPS_2
// HIP's headers spell the half types both ways
using half = __half;

// HIP-CPU's __half2 members are proxies of half_float::half: `(float)h2.x` needs two user conversions and
// `h2.x = 1.f` an explicit one, where CUDA's and HIP's __half2 hold two plain __half. Programs get that pair,
// which converts to and from HIP-CPU's (the same four bytes) for its intrinsics (__hadd2, __low2float...)
struct opscope_half2 {
    __half x, y;
    opscope_half2() = default;
    opscope_half2(__half a, __half b) : x(a), y(b) {}
    opscope_half2(float a, float b) : x(a), y(b) {}
    opscope_half2(hip::detail::half2 v) : x(v.x), y(v.y) {}
    operator hip::detail::half2() const { return hip::detail::half2{x, y}; }
    opscope_half2& operator+=(opscope_half2 o) { return *this = __hadd2(*this, o); }
    opscope_half2& operator-=(opscope_half2 o) { return *this = __hsub2(*this, o); }
    opscope_half2& operator*=(opscope_half2 o) { return *this = __hmul2(*this, o); }
    opscope_half2& operator/=(opscope_half2 o) { return *this = __h2div(*this, o); }
};
static_assert(sizeof(opscope_half2) == sizeof(hip::detail::half2), "a half2 is two halves, as on the device");
inline opscope_half2 operator+(opscope_half2 a, opscope_half2 b) { return __hadd2(a, b); }
inline opscope_half2 operator-(opscope_half2 a, opscope_half2 b) { return __hsub2(a, b); }
inline opscope_half2 operator*(opscope_half2 a, opscope_half2 b) { return __hmul2(a, b); }
inline opscope_half2 operator/(opscope_half2 a, opscope_half2 b) { return __h2div(a, b); }
inline opscope_half2 operator-(opscope_half2 a) { return __hneg2(a); }
#define __half2 opscope_half2
using half2 = opscope_half2;

// CUDA and HIP have min/max for device code in the global namespace
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// HIP takes the flags as unsigned int; HIP-CPU only as its enum
inline hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned int flags) {
    return hipEventCreateWithFlags(event, static_cast<hipEventFlags>(flags));
}

// HIP's occupancy calls take int*; HIP-CPU's take std::uint32_t* and no defaults
template <typename F>
inline hipError_t hipOccupancyMaxPotentialBlockSize(int* grid_size, int* block_size, F f,
                                                    std::size_t dynamic_shared = 0, int block_size_limit = 0) {
    std::uint32_t g = 0, b = 0;
    hipError_t e = hipOccupancyMaxPotentialBlockSize(&g, &b, f, dynamic_shared, std::uint32_t(block_size_limit));
    *grid_size = int(g);
    *block_size = int(b);
    return e;
}

// HIP's older name for a pinned allocation: on the CPU every allocation is host memory
inline hipError_t hipHostAlloc(void** ptr, std::size_t size, unsigned int /*flags*/) {
    return hipHostMalloc(ptr, size);
}
template <typename T> inline hipError_t hipHostAlloc(T** ptr, std::size_t size, unsigned int flags) {
    return hipHostAlloc(reinterpret_cast<void**>(ptr), size, flags);
}

// the calling-convention mark of callbacks: nothing on Linux (opscope's table leaves CUDART_CB as written)
#ifndef HIPRT_CB
#define HIPRT_CB
#endif
#ifndef CUDART_CB
#define CUDART_CB
#endif
// a stream callback runs after the work queued before it; here: wait for that work, then call
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void* user_data);
inline hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback, void* user_data,
                                       unsigned int /*flags*/) {
    hipError_t e = hipStreamSynchronize(stream);
    callback(stream, e, user_data);
    return hipSuccess;
}

template <typename F, typename SharedOfBlock>
inline hipError_t hipOccupancyMaxPotentialBlockSizeVariableSMem(int* grid_size, int* block_size, F f,
                                                                SharedOfBlock shared_of_block, int limit = 0) {
    hipError_t e = hipOccupancyMaxPotentialBlockSize(grid_size, block_size, f, 0, limit);
    return e == hipSuccess ? hipOccupancyMaxPotentialBlockSize(grid_size, block_size, f,
                                                                 std::size_t(shared_of_block(*block_size)), limit)
                           : e;
}

// stream-ordered memory pools: one default pool, whose attributes change nothing on the CPU
typedef struct opscope_hip_cpu_mem_pool* hipMemPool_t;
enum hipMemPoolAttr { hipMemPoolReuseFollowEventDependencies = 1, hipMemPoolReuseAllowOpportunistic,
                      hipMemPoolReuseAllowInternalDependencies, hipMemPoolAttrReleaseThreshold,
                      hipMemPoolAttrReservedMemCurrent, hipMemPoolAttrReservedMemHigh,
                      hipMemPoolAttrUsedMemCurrent, hipMemPoolAttrUsedMemHigh };
inline hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t* pool, int /*device*/) {
    static int the_pool;
    *pool = reinterpret_cast<hipMemPool_t>(&the_pool);
    return hipSuccess;
}
inline hipError_t hipMemPoolSetAttribute(hipMemPool_t, hipMemPoolAttr, void*) { return hipSuccess; }
inline hipError_t hipMemPoolGetAttribute(hipMemPool_t, hipMemPoolAttr, void* value) {
    *static_cast<std::uint64_t*>(value) = 0;
    return hipSuccess;
}

// HIP-CPU's hipMallocAsync allocates when the stream reaches it, so a hipMemcpyAsync queued next is refused
// (hipErrorInvalidValue on the null pointer); allocating at once keeps stream order (hipFreeAsync frees with free)
inline hipError_t opscope_hip_malloc_async(void** ptr, std::size_t size, hipStream_t = {}) {
    if (!ptr) return hipErrorInvalidValue;
    *ptr = size ? std::malloc(size) : nullptr;
    return hipSuccess;
}
template <typename T> inline hipError_t opscope_hip_malloc_async(T** ptr, std::size_t size, hipStream_t s = {}) {
    return opscope_hip_malloc_async(reinterpret_cast<void**>(ptr), size, s);
}
#define hipMallocAsync opscope_hip_malloc_async

// HIP-CPU's atomicInc/atomicDec ignore their bound; HIP's (and CUDA's) wrap at it
inline unsigned int opscope_atomic_inc(unsigned int* address, unsigned int bound) {
    unsigned int old = *address, seen;
    do {
        seen = old;
        old = atomicCAS(address, seen, seen >= bound ? 0u : seen + 1u);
    } while (old != seen);
    return old;
}
inline unsigned int opscope_atomic_dec(unsigned int* address, unsigned int bound) {
    unsigned int old = *address, seen;
    do {
        seen = old;
        old = atomicCAS(address, seen, (seen == 0u || seen > bound) ? bound : seen - 1u);
    } while (old != seen);
    return old;
}
#define atomicInc opscope_atomic_inc
#define atomicDec opscope_atomic_dec

// the *_system atomics: on the CPU every atomic is system-wide
#define OPSCOPE_SYSTEM_ATOMIC(name) \
    template <typename... A> inline auto name##_system(A... a) { return name(a...); }
OPSCOPE_SYSTEM_ATOMIC(atomicAdd) OPSCOPE_SYSTEM_ATOMIC(atomicSub) OPSCOPE_SYSTEM_ATOMIC(atomicExch)
OPSCOPE_SYSTEM_ATOMIC(atomicMax) OPSCOPE_SYSTEM_ATOMIC(atomicMin) OPSCOPE_SYSTEM_ATOMIC(atomicCAS)
OPSCOPE_SYSTEM_ATOMIC(atomicAnd) OPSCOPE_SYSTEM_ATOMIC(atomicOr) OPSCOPE_SYSTEM_ATOMIC(atomicXor)
template <typename... A> inline auto atomicInc_system(A... a) { return opscope_atomic_inc(a...); }
template <typename... A> inline auto atomicDec_system(A... a) { return opscope_atomic_dec(a...); }

// the *_sync shuffles: HIP-CPU runs a warp's lanes as one fiber group, every lane active
template <typename T> inline T __shfl_sync(std::uint64_t, T v, std::int32_t lane, std::int32_t w = warpSize) {
    return __shfl(v, lane, w);
}
template <typename T> inline T __shfl_up_sync(std::uint64_t, T v, std::uint32_t d, std::int32_t w = warpSize) {
    return __shfl_up(v, d, w);
}
template <typename T> inline T __shfl_down_sync(std::uint64_t, T v, std::uint32_t d, std::int32_t w = warpSize) {
    return __shfl_down(v, d, w);
}
template <typename T> inline T __shfl_xor_sync(std::uint64_t, T v, std::int32_t m, std::int32_t w = warpSize) {
    return __shfl_xor(v, m, w);
}

// CUDA's votes take an `unsigned` lane mask over a 32-lane warp, HIP's a 64-bit mask over a 64-lane wavefront
// (HIP-CPU's warp). The mask's type says which the program means: a mask of 32 bits or fewer votes among the
// caller's 32 lanes, as CUDA does (simpleVoteIntrinsics checks 32-lane results); a 64-bit one among all 64.
template <typename M> inline auto __ballot_sync(M mask, std::int32_t predicate) {
    static_assert(std::is_integral_v<M>, "a lane mask is an integer");
    const std::uint64_t all = __ballot(predicate);
    if constexpr (sizeof(M) <= 4) {
        const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
        const unsigned half = (tid % warpSize) / 32 * 32;                 // lanes 0-31 or 32-63 of the wavefront
        return static_cast<unsigned>(all >> half) & static_cast<unsigned>(mask);
    } else {
        return all & static_cast<std::uint64_t>(mask);
    }
}
template <typename M> inline std::int32_t __any_sync(M mask, std::int32_t predicate) {
    return __ballot_sync(mask, predicate) != 0;
}
template <typename M> inline std::int32_t __all_sync(M mask, std::int32_t predicate) {
    return __ballot_sync(mask, predicate) == __ballot_sync(mask, 1);
}

// HIP's hipDeviceProp_t has fields HIP-CPU's lacks; programs read them after hipGetDeviceProperties. The values
// say what a CPU is: host memory is the device's (managed, pageable, mapped, coherent), no persisting L2 window.
struct opscope_hip_device_prop : hipDeviceProp_t {
    int asyncEngineCount, unifiedAddressing, managedMemory, concurrentManagedAccess, pageableMemoryAccess,
        pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost, hostNativeAtomicSupported,
        canUseHostPointerForRegisteredMem, hostRegisterSupported, memoryPoolsSupported, streamPrioritiesSupported,
        globalL1CacheSupported, localL1CacheSupported, computePreemptionSupported, persistingL2CacheMaxSize,
        accessPolicyMaxWindowSize, maxBlocksPerMultiProcessor, regsPerMultiprocessor, multiGpuBoardGroupID,
        ipcEventSupported, clusterLaunch, gpuDirectRDMASupported;
    std::size_t sharedMemPerMultiprocessor, sharedMemPerBlockOptin, reservedSharedMemPerBlock;
};
inline hipError_t hipGetDeviceProperties(opscope_hip_device_prop* prop, int device) {
    hipError_t e = hipGetDeviceProperties(static_cast<hipDeviceProp_t*>(prop), device);
    if (e != hipSuccess) return e;
    prop->asyncEngineCount = 1;
    prop->unifiedAddressing = prop->managedMemory = prop->concurrentManagedAccess = 1;
    prop->pageableMemoryAccess = prop->pageableMemoryAccessUsesHostPageTables = 1;
    prop->directManagedMemAccessFromHost = prop->hostNativeAtomicSupported = 1;
    prop->canUseHostPointerForRegisteredMem = prop->hostRegisterSupported = prop->memoryPoolsSupported = 1;
    prop->streamPrioritiesSupported = 0;
    prop->globalL1CacheSupported = prop->localL1CacheSupported = 1;
    prop->computePreemptionSupported = 0;
    prop->persistingL2CacheMaxSize = prop->accessPolicyMaxWindowSize = 0;   // no L2 access-policy windows
    prop->maxBlocksPerMultiProcessor = 1;
    prop->regsPerMultiprocessor = prop->regsPerBlock;
    prop->multiGpuBoardGroupID = prop->ipcEventSupported = prop->clusterLaunch = prop->gpuDirectRDMASupported = 0;
    prop->sharedMemPerMultiprocessor = prop->maxSharedMemoryPerMultiProcessor;
    prop->sharedMemPerBlockOptin = prop->sharedMemPerBlock;
    prop->reservedSharedMemPerBlock = 0;
    return hipSuccess;
}
#define hipDeviceProp_t opscope_hip_device_prop

// HIP's version macros (hip/hip_version.h), which HIP-CPU lacks: the HIP API these headers stand in for (6.0,
// the ROCm hipify's tables follow). CUDART_VERSION stays undefined under hipcc, as hipify leaves it; code that
// branches on it (`#if CUDART_VERSION >= 4000`) reads it here as the CUDA runtime HIP 6.0 follows, 12.0
#ifndef HIP_VERSION
#define HIP_VERSION_MAJOR 6
#define HIP_VERSION_MINOR 0
#define HIP_VERSION_PATCH 0
#define HIP_VERSION (HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 + HIP_VERSION_PATCH)
#endif
#ifndef CUDART_VERSION
#define CUDART_VERSION 12000
#endif
#endif
