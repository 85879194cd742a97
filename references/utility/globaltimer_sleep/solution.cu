// Timed waits on the GPU: entry b waits at least ns[b] nanoseconds of %globaltimer time,
// sleeping with __nanosleep between readings, and reports the time it measured.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// One thread per entry, all of a call's entries at once where the GPU holds them (waiting
// threads cost no issue slots while they sleep). A thread reads %globaltimer when it starts,
// then sleeps in naps and reads the timer again until the request has passed. A nap of t ns
// lasts anywhere from 0 to 2t (and never more than about 1 ms), so a nap of half of what is
// left never sleeps past the deadline by more than a timer step; naps are capped so that the
// threads of a warp with different deadlines do not hold each other up for long.
constexpr int kThreads = 128;
constexpr uint64_t kMaxNapNs = 20000;  // 20 us

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads)
timed_wait(const int64_t* __restrict__ ns, int64_t* __restrict__ elapsed, size_t count) {
  const size_t b = (size_t)blockIdx.x * kThreads + threadIdx.x;
  if (b >= count) return;
  const uint64_t want = (uint64_t)ns[b];
  const uint64_t start = globaltimer_ns();
  uint64_t now = start;
  while (now - start < want) {
    uint64_t nap = (want - (now - start)) / 2;
    if (nap > kMaxNapNs) nap = kMaxNapNs;
    __nanosleep((unsigned)nap);
    now = globaltimer_ns();
  }
  elapsed[b] = (int64_t)(now - start);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int64_t* ns = (const int64_t*)ctx->buffers[0];  // count requests, in ns (device)
  int64_t* elapsed = (int64_t*)ctx->buffers[1];        // count measured waits, in ns (device)
  const size_t count = ctx->buffer_bytes[0] / sizeof(int64_t);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (count == 0) return 0;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  timed_wait<<<(unsigned)blocks, kThreads, 0, stream>>>(ns, elapsed, count);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
