// MoE dispatch layout (DeepEP-style): from the experts each token was routed to, the number of
// tokens every rank and every expert receives and the token-to-rank table that a dispatch is
// planned from. Every rank computes its own; there is no communication.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: one kernel. Each block takes tiles of 256 tokens (a thread per token): the token's
// unmasked experts go into a shared-memory histogram, its rank mask into its is_token_in_rank
// row (one store of `world` bytes), and per rank a warp ballot counts the tokens with an
// expert there. The block then adds its non-zero counts into counters in the workspace
// (global atomics); the last block to finish (a retire counter) moves the counters into the
// outputs and zeroes them for the next call with one atomicExch each. Calls on the stream run
// in order, so the counters are always zero when a call begins.
constexpr int THREADS = 256;
constexpr int MAX_EXPERTS = 1024;
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;  // rank masks fit in 32 bits
constexpr int MAX_BLOCKS = 1024;

struct Scratch {
  unsigned int retired;                        // blocks finished in this call
  unsigned int pad[31];
  int counts[MAX_EXPERTS + MAX_RANKS];         // experts, then ranks; zero between calls
};

__global__ void __launch_bounds__(THREADS) dispatch_layout(
    const long long* __restrict__ topk_idx, int T, int topk, int experts, int per_rank, int world,
    int* __restrict__ per_rank_out, int* __restrict__ per_expert_out, uint8_t* __restrict__ in_rank,
    Scratch* scratch) {
  __shared__ int hist[MAX_EXPERTS + MAX_RANKS];
  __shared__ bool last;
  const int counters = experts + world;
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < counters; i += THREADS) hist[i] = 0;
  __syncthreads();
  // the loop bound is the same for every thread of the block: the ballots see full warps
  for (long long first = (long long)blockIdx.x * THREADS; first < T;
       first += (long long)gridDim.x * THREADS) {
    const long long t = first + threadIdx.x;
    uint32_t mask = 0;
    if (t < T) {
      const long long* e = topk_idx + t * topk;
      for (int k = 0; k < topk; ++k) {
        const long long x = __ldg(e + k);
        if (x >= 0) {
          atomicAdd(&hist[x], 1);
          mask |= 1u << (int)(x / per_rank);
        }
      }
      uint8_t* row = in_rank + t * world;
      if (world == 8 || world == 4 || world == 2) {  // the row in one aligned store
        unsigned long long bytes = 0;
        for (int r = 0; r < world; ++r) bytes |= (unsigned long long)((mask >> r) & 1u) << (8 * r);
        if (world == 8) *reinterpret_cast<unsigned long long*>(row) = bytes;
        else if (world == 4) *reinterpret_cast<uint32_t*>(row) = (uint32_t)bytes;
        else *reinterpret_cast<uint16_t*>(row) = (uint16_t)bytes;
      } else {
        for (int r = 0; r < world; ++r) row[r] = (uint8_t)((mask >> r) & 1u);
      }
    }
    for (int r = 0; r < world; ++r) {
      const uint32_t b = __ballot_sync(0xffffffffu, (mask >> r) & 1u);
      if (lane == 0 && b) atomicAdd(&hist[experts + r], __popc(b));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < counters; i += THREADS)
    if (hist[i]) atomicAdd(&scratch->counts[i], hist[i]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&scratch->retired, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < counters; i += THREADS) {
    const int n = atomicExch(&scratch->counts[i], 0);
    if (i < experts) per_expert_out[i] = n;
    else per_rank_out[i - experts] = n;
  }
  if (threadIdx.x == 0) scratch->retired = 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: topk_idx, num_tokens_per_rank, num_tokens_per_expert,
  // is_token_in_rank; params: num_experts
  const int world = ctx->world_size;
  const int64_t num_experts = ctx->params[0];
  // shapes: T tokens (is_token_in_rank holds T * world bytes), topk experts per token
  const int64_t T = (int64_t)(ctx->buffer_bytes[3] / (size_t)world);
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(int64_t) * (size_t)T)) : 0;
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[0];  // (T, topk); -1: a masked slot
  int32_t* num_tokens_per_rank = (int32_t*)ctx->buffers[1];    // (world,)
  int32_t* num_tokens_per_expert = (int32_t*)ctx->buffers[2];  // (num_experts,)
  uint8_t* is_token_in_rank = (uint8_t*)ctx->buffers[3];       // (T, world): 0 or 1
  // ctx->workspace: ctx->workspace_bytes of device scratch, zeroed once before the first call
  // and kept across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || num_experts < world || num_experts > MAX_EXPERTS ||
      num_experts % world || T < 1 || T > (1 << 30) || topk < 1)
    return 2;
  if (ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Scratch)) return 3;
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 4;
  // no block waits for another: any grid works; a few tiles per block at the largest sizes
  long long blocks = (T + THREADS - 1) / THREADS;
  const long long cap = 2LL * (sms > 0 ? sms : 1);
  if (blocks > cap) blocks = cap;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  dispatch_layout<<<(unsigned)blocks, THREADS, 0, stream>>>(
      (const long long*)topk_idx, (int)T, (int)topk, (int)num_experts, (int)(num_experts / world),
      world, num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank,
      (Scratch*)ctx->workspace);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
