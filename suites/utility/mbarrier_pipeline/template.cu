// out = 2 * x + 1 through a warp-specialized shared-memory pipeline synchronized by mbarriers.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT config
// Pipeline shape, used by the fixed kernel skeleton below.
constexpr int kStages = 4;          // stages in the shared-memory ring
constexpr int kTileFloats = 8192;   // floats per stage (a multiple of 4)
constexpr int kConsumerWarps = 8;   // consumer warps per CTA (warp 0 is the producer)
// <<< COMMBENCH EDIT

constexpr int kThreads = 32 * (1 + kConsumerWarps);
constexpr size_t kRingBytes = (size_t)kStages * kTileFloats * sizeof(float);
constexpr size_t kSmemBytes = kRingBytes + 2 * kStages * sizeof(uint64_t);
static_assert(kTileFloats % 4 == 0, "stages must hold whole 16-byte words");

// >>> COMMBENCH EDIT helpers
// <<< COMMBENCH EDIT

// The skeleton: warp 0 is the producer, which fills the stages of a ring in shared memory;
// warps 1 .. kConsumerWarps are the consumers, which compute from the stages and write `out`.
// full[s] and empty[s] are the mbarriers of stage s (64-bit objects in shared memory).
__global__ void __launch_bounds__(kThreads)
scale_shift_pipeline(const float* __restrict__ x, float* __restrict__ out, size_t n) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* ring = reinterpret_cast<float*>(smem);                     // stage s: ring + s * kTileFloats
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kRingBytes);  // kStages barriers
  uint64_t* empty = full + kStages;                                 // kStages barriers
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // >>> COMMBENCH EDIT init
  // <<< COMMBENCH EDIT
  __syncthreads();
  if (warp == 0) {
    // >>> COMMBENCH EDIT producer
    // <<< COMMBENCH EDIT
  } else {
    // >>> COMMBENCH EDIT consumer
    // <<< COMMBENCH EDIT
  }
}

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];  // n floats
  float* out = (float*)ctx->buffers[1];            // n floats
  const size_t n = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)x; (void)out; (void)n; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
