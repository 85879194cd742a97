// A device-to-host FIFO: a kernel produces one record per element into a bounded ring in
// pinned, mapped host memory while the host consumes the records, places each value where
// its record says, and uploads the result.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT fifo
// Design:
//   - the ring: CAP records of 16 bytes in pinned host memory mapped into the device. Record
//     s (numbered from 0 over the whole run) lives in slot s % CAP and carries {index, value}
//     in one 8-byte word, then `seq` = s + 1, stored with a system-scope release after the
//     payload: the host, which waits for exactly s + 1 in that slot, never reads a record
//     half written or left from an earlier lap;
//   - producers: each warp reserves the numbers of its (up to) 32 records with one atomicAdd
//     on a device counter that lives for the whole run, and lane 0 waits for credits (the
//     host's `consumed` count, read from mapped memory only when the cached limit is used
//     up): record s may be written once consumed > s - CAP. Every reserved number belongs to
//     a warp that is running, so the smallest unwritten record always gets its credit: no
//     block needs another to be resident;
//   - the host: consumes records in order, writes value to staging[index], publishes
//     `consumed` whenever it would otherwise wait (and every 256 records), and after the last
//     record uploads staging into `out` on the stream. staging is rewritten only after a
//     record of this call has arrived, i.e. after this call's kernel began, which is after
//     the previous call's upload from it (same stream).
#include <sched.h>
#include <string.h>

constexpr int CAP = 1024;     // records the ring holds
constexpr int THREADS = 256;  // producer block

struct Record {
  uint64_t payload;  // index (low 32 bits) | value bits (high 32 bits)
  uint64_t seq;      // 1 + the record's number, written last
};

struct Ring {  // pinned, mapped
  Record rec[CAP];
  alignas(64) uint64_t consumed;  // host -> device: records consumed so far (credits)
};

__device__ unsigned long long g_reserved = 0;  // records reserved so far (the whole run)

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__global__ void __launch_bounds__(THREADS)
produce(const float* __restrict__ x, const int32_t* __restrict__ idx, size_t records, Ring* ring) {
  const unsigned lane = threadIdx.x & 31;
  const size_t warp = ((size_t)blockIdx.x * THREADS + threadIdx.x) >> 5;
  const size_t warps = ((size_t)gridDim.x * THREADS) >> 5;
  unsigned long long limit = 0;  // lane 0: records that may be written, as last read
  for (size_t base = warp * 32; base < records; base += warps * 32) {
    const unsigned n = records - base < 32 ? (unsigned)(records - base) : 32u;
    unsigned long long first = 0;
    if (lane == 0) {
      first = atomicAdd(&g_reserved, (unsigned long long)n);
      while (first + n > limit) limit = ld_acquire_sys(&ring->consumed) + CAP;
    }
    first = __shfl_sync(0xffffffffu, first, 0);  // also orders the lanes after the credit wait
    __syncwarp();
    if (lane < n) {
      const size_t i = base + lane;
      const float v = 2.0f * x[i] + 1.0f;
      const unsigned long long s = first + lane;
      Record* r = &ring->rec[s % CAP];
      const uint64_t word = (uint64_t)__float_as_uint(v) << 32 | (uint32_t)idx[i];
      *(volatile uint64_t*)&r->payload = word;
      st_release_sys(&r->seq, s + 1);
    }
  }
}

static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];        // count floats, input
  const int32_t* idx = (const int32_t*)ctx->buffers[1];  // count int32, a permutation of 0 .. count-1, input
  float* out = (float*)ctx->buffers[2];                  // count floats, output
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int device = ctx->device;                        // already current
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  if (count == 0) return 0;
  if (count > 0x7fffffffu) return 2;
  static Ring* ring = nullptr;      // host view
  static Ring* ring_dev = nullptr;  // device view
  static float* staging = nullptr;  // pinned, the result before its upload
  static size_t staging_count = 0;
  static uint64_t consumed = 0;     // records consumed by earlier calls
  static int sms = 0;
  if (!ring) {
    if (cudaHostAlloc((void**)&ring, sizeof(Ring), cudaHostAllocMapped) != cudaSuccess) return 3;
    memset(ring, 0, sizeof(Ring));
    if (cudaHostGetDevicePointer((void**)&ring_dev, ring, 0) != cudaSuccess) return 3;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 3;
  }
  if (staging_count < count) {  // a larger size: the old buffer's last upload must be done
    if (staging) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) return 3;
      cudaFreeHost(staging);
      staging = nullptr;
      staging_count = 0;
    }
    if (cudaHostAlloc((void**)&staging, count * sizeof(float), cudaHostAllocDefault) != cudaSuccess)
      return 3;
    staging_count = count;
  }

  const size_t records = count;  // one per element
  size_t blocks = (records + THREADS - 1) / THREADS;
  if (blocks > (size_t)sms) blocks = (size_t)sms;
  if (blocks < 1) blocks = 1;
  produce<<<(unsigned)blocks, THREADS, 0, stream>>>(x, idx, records, ring_dev);
  if (cudaGetLastError() != cudaSuccess) return 1;

  const uint64_t start = consumed, end = consumed + records;
  uint64_t t = start, published = start;
  unsigned long long idle = 0;
  int finished_seen = 0;
  bool bad = false;
  while (t < end) {
    Record* r = &ring->rec[t % CAP];
    if (__atomic_load_n(&r->seq, __ATOMIC_ACQUIRE) != t + 1) {
      if (published != t) {  // about to wait: hand the producers every credit there is
        __atomic_store_n(&ring->consumed, t, __ATOMIC_RELEASE);
        published = t;
      }
      cpu_relax();
      if ((++idle & ((1u << 20) - 1)) == 0) {  // now and then: has the kernel failed?
        const cudaError_t q = cudaStreamQuery(stream);
        if (q != cudaSuccess && q != cudaErrorNotReady) return 6;
        if (q == cudaSuccess && ++finished_seen > 2) return 7;  // done, yet records missing
      }
      continue;
    }
    const uint64_t word = __atomic_load_n(&r->payload, __ATOMIC_RELAXED);
    const uint32_t index = (uint32_t)word;
    const uint32_t bits = (uint32_t)(word >> 32);
    if (index < count) memcpy(&staging[index], &bits, sizeof(bits));
    else bad = true;  // keep consuming: the producers must be able to finish
    ++t;
    if ((t & 255) == 0) {
      __atomic_store_n(&ring->consumed, t, __ATOMIC_RELEASE);
      published = t;
    }
  }
  __atomic_store_n(&ring->consumed, t, __ATOMIC_RELEASE);
  consumed = end;
  if (cudaMemcpyAsync(out, staging, count * sizeof(float), cudaMemcpyHostToDevice, stream) !=
      cudaSuccess)
    return 1;
  return bad ? 5 : 0;
  // <<< COMMBENCH EDIT
}
