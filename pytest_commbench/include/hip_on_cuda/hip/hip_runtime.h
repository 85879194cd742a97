// pytest-commbench: HIP on an NVIDIA GPU, for the logic check of HIP tasks (platform h200-hip).
//
// A HIP solution is compiled by nvcc with this folder first on the include path: the HIP
// runtime names it uses become the CUDA runtime's, its kernels CUDA kernels. What this checks:
// the solution's host logic (IPC handles, streams, events, the order of its calls) and its
// kernels' results. What it cannot check: a wavefront of 64 (warpSize is 32 here), AMD's
// atomic scopes and fine-grained memory, xGMI coherence. Results on h200-hip are never results
// on an AMD GPU. Only the part of HIP the suite's tasks use is here; a name it lacks is a
// compile error, as on a HIP version that lacks it.
#ifndef COMMBENCH_HIP_ON_CUDA_H
#define COMMBENCH_HIP_ON_CUDA_H

#include <cuda_runtime.h>
#include <cuda/atomic>
#include <stdint.h>

#define __HIP_PLATFORM_NVIDIA__ 1
#define COMMBENCH_HIP_ON_CUDA 1

// types
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaIpcMemHandle_t hipIpcMemHandle_t;
typedef cudaIpcEventHandle_t hipIpcEventHandle_t;
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaMemcpyKind hipMemcpyKind;
typedef cudaDeviceAttr hipDeviceAttribute_t;

// error codes and flags
#define hipSuccess cudaSuccess
#define hipErrorNotReady cudaErrorNotReady
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemcpyHostToHost cudaMemcpyHostToHost
#define hipMemcpyDefault cudaMemcpyDefault
#define hipStreamDefault cudaStreamDefault
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipEventDefault cudaEventDefault
#define hipEventDisableTiming cudaEventDisableTiming
#define hipEventInterprocess cudaEventInterprocess
#define hipEventBlockingSync cudaEventBlockingSync
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostMallocPortable cudaHostAllocPortable
#define hipHostMallocMapped cudaHostAllocMapped
#define hipHostMallocWriteCombined cudaHostAllocWriteCombined
#define hipHostMallocCoherent 0
#define hipHostMallocNonCoherent 0
#define hipDeviceMallocDefault 0
#define hipDeviceMallocFinegrained 1
#define hipDeviceMallocUncached 2
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeMaxThreadsPerBlock cudaDevAttrMaxThreadsPerBlock
#define hipDeviceAttributeWarpSize cudaDevAttrWarpSize
#define hipDeviceAttributeMaxSharedMemoryPerBlock cudaDevAttrMaxSharedMemoryPerBlock
#define hipDeviceAttributeClockRate cudaDevAttrClockRate
#define hipDeviceAttributePciBusId cudaDevAttrPciBusId
#define hipDeviceAttributePciDeviceId cudaDevAttrPciDeviceId

// the runtime API
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define hipDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMallocManaged cudaMallocManaged
#define hipHostMalloc cudaHostAlloc
#define hipHostFree cudaFreeHost
#define hipHostRegister cudaHostRegister
#define hipHostUnregister cudaHostUnregister
#define hipHostGetDevicePointer cudaHostGetDevicePointer
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyPeer cudaMemcpyPeer
#define hipMemcpyPeerAsync cudaMemcpyPeerAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemsetD32Async(dst, value, count, stream) \
  cudaMemsetAsync((dst), 0, 0, (stream)), commbench_hip_memset_d32((dst), (value), (count), (stream))
#define hipStreamCreate cudaStreamCreate
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamQuery cudaStreamQuery
#define hipStreamWaitEvent cudaStreamWaitEvent
#define hipEventCreate cudaEventCreate
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventQuery cudaEventQuery
#define hipEventElapsedTime cudaEventElapsedTime
#define hipIpcGetMemHandle cudaIpcGetMemHandle
// pointer attributes (HIP's struct has CUDA's fields under the same names: type, device,
// devicePointer, hostPointer)
typedef cudaPointerAttributes hipPointerAttribute_t;
#define hipPointerGetAttributes cudaPointerGetAttributes
#define hipMemoryType cudaMemoryType
#define hipMemoryTypeUnregistered cudaMemoryTypeUnregistered
#define hipMemoryTypeHost cudaMemoryTypeHost
#define hipMemoryTypeDevice cudaMemoryTypeDevice
#define hipMemoryTypeManaged cudaMemoryTypeManaged
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#define hipIpcGetEventHandle cudaIpcGetEventHandle
#define hipIpcOpenEventHandle cudaIpcOpenEventHandle
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor

// hipExtMallocWithFlags: fine-grained or uncached memory on AMD; plain device memory here
static inline hipError_t hipExtMallocWithFlags(void** ptr, size_t bytes, unsigned int flags) {
  (void)flags;
  return cudaMalloc(ptr, bytes);
}

// kernel launches
#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...) \
  kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__)

// device side: indices as HIP spells them besides CUDA's own
#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y

// warp-wide operations without a mask, as HIP has them (the whole warp takes part); CUDA's
// own mask-less forms of these names are not allowed on sm_70 and later
#define COMMBENCH_FULL_MASK 0xffffffffu
#define __shfl(v, ...) __shfl_sync(COMMBENCH_FULL_MASK, (v), __VA_ARGS__)
#define __shfl_xor(v, ...) __shfl_xor_sync(COMMBENCH_FULL_MASK, (v), __VA_ARGS__)
#define __shfl_down(v, ...) __shfl_down_sync(COMMBENCH_FULL_MASK, (v), __VA_ARGS__)
#define __shfl_up(v, ...) __shfl_up_sync(COMMBENCH_FULL_MASK, (v), __VA_ARGS__)
#define __ballot(p) ((unsigned long long)__ballot_sync(COMMBENCH_FULL_MASK, (p)))

// HIP's scoped atomic builtins (clang's __hip_atomic_*), on libcu++'s atomic_ref
#define __HIP_MEMORY_SCOPE_SINGLETHREAD 1
#define __HIP_MEMORY_SCOPE_WAVEFRONT 2
#define __HIP_MEMORY_SCOPE_WORKGROUP 3
#define __HIP_MEMORY_SCOPE_AGENT 4
#define __HIP_MEMORY_SCOPE_SYSTEM 5

namespace commbench_hip {
__device__ inline cuda::std::memory_order order(int o) {
  switch (o) {
    case __ATOMIC_RELAXED: return cuda::std::memory_order_relaxed;
    case __ATOMIC_ACQUIRE: return cuda::std::memory_order_acquire;
    case __ATOMIC_RELEASE: return cuda::std::memory_order_release;
    case __ATOMIC_ACQ_REL: return cuda::std::memory_order_acq_rel;
    default: return cuda::std::memory_order_seq_cst;
  }
}
// the scope is taken as the widest that the call names or implies: system where the peers'
// memory is involved, device otherwise (block and narrower: device, which is stronger)
template <typename T, typename F> __device__ inline auto scoped(T* p, int scope, F f) {
  if (scope == __HIP_MEMORY_SCOPE_SYSTEM) {
    cuda::atomic_ref<T, cuda::thread_scope_system> a(*p);
    return f(a);
  }
  cuda::atomic_ref<T, cuda::thread_scope_device> a(*p);
  return f(a);
}
}  // namespace commbench_hip

template <typename T> __device__ inline T __hip_atomic_load(T* p, int o, int scope) {
  return commbench_hip::scoped(p, scope, [&](auto& a) { return a.load(commbench_hip::order(o)); });
}
template <typename T, typename U> __device__ inline void __hip_atomic_store(T* p, U v, int o, int scope) {
  commbench_hip::scoped(p, scope, [&](auto& a) { a.store(T(v), commbench_hip::order(o)); return 0; });
}
template <typename T, typename U> __device__ inline T __hip_atomic_fetch_add(T* p, U v, int o, int scope) {
  return commbench_hip::scoped(p, scope, [&](auto& a) { return a.fetch_add(T(v), commbench_hip::order(o)); });
}
template <typename T, typename U> __device__ inline T __hip_atomic_exchange(T* p, U v, int o, int scope) {
  return commbench_hip::scoped(p, scope, [&](auto& a) { return a.exchange(T(v), commbench_hip::order(o)); });
}
// the other read-modify-write builtins clang's HIP has (fetch and/or/xor/min/max/sub):
// libcu++'s atomic_ref has each of them
#define COMMBENCH_HIP_RMW(name, op)                                                            \
  template <typename T, typename U> __device__ inline T name(T* p, U v, int o, int scope) {  \
    return commbench_hip::scoped(p, scope, [&](auto& a) { return a.op(T(v), commbench_hip::order(o)); }); \
  }
COMMBENCH_HIP_RMW(__hip_atomic_fetch_sub, fetch_sub)
COMMBENCH_HIP_RMW(__hip_atomic_fetch_and, fetch_and)
COMMBENCH_HIP_RMW(__hip_atomic_fetch_or, fetch_or)
COMMBENCH_HIP_RMW(__hip_atomic_fetch_xor, fetch_xor)
COMMBENCH_HIP_RMW(__hip_atomic_fetch_min, fetch_min)
COMMBENCH_HIP_RMW(__hip_atomic_fetch_max, fetch_max)
#undef COMMBENCH_HIP_RMW
template <typename T, typename U>
__device__ inline bool __hip_atomic_compare_exchange_weak(T* p, T* expected, U desired, int success,
                                                          int failure, int scope) {
  (void)failure;
  return commbench_hip::scoped(p, scope, [&](auto& a) {
    return a.compare_exchange_weak(*expected, T(desired), commbench_hip::order(success));
  });
}
template <typename T, typename U>
__device__ inline bool __hip_atomic_compare_exchange_strong(T* p, T* expected, U desired, int success,
                                                            int failure, int scope) {
  (void)failure;
  return commbench_hip::scoped(p, scope, [&](auto& a) {
    return a.compare_exchange_strong(*expected, T(desired), commbench_hip::order(success));
  });
}

// AMD's sleep and clock builtins
__device__ inline void __builtin_amdgcn_s_sleep(int n) { __nanosleep(64u * (unsigned)(n > 0 ? n : 1)); }
// wall_clock64: a constant-rate counter (100 MHz on MI300-class GPUs); here the global timer
// (nanoseconds) divided to the same rate
__device__ inline unsigned long long wall_clock64() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns / 10ull;
}

static __global__ void commbench_hip_fill_d32(uint32_t* dst, uint32_t value, size_t count) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = value;
}
static inline hipError_t commbench_hip_memset_d32(void* dst, int value, size_t count, hipStream_t s) {
  commbench_hip_fill_d32<<<128, 256, 0, s>>>((uint32_t*)dst, (uint32_t)value, count);
  return cudaGetLastError();
}

#endif  // COMMBENCH_HIP_ON_CUDA_H
