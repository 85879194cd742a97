// MoE notify step (DeepEP-style, intranode): before a dispatch, every rank learns from every
// other how many tokens it will receive from it and for each of its experts, through the
// workspaces the ranks share over CUDA IPC.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: one block per rank and call. Rank s owes rank d the words (num_tokens_per_rank[d],
// num_tokens_per_expert[d * L + j] for j < L); it stores them straight into d's workspace,
// each as one 64-bit word epoch << 32 | value, so a word names the call it belongs to and
// needs no flag of its own. Then it waits, word by word, until every source's words of this
// call are in its own workspace, adds up the per-expert counts in shared memory and writes
// its outputs. The epoch is the call number, kept on the host (every rank makes the same
// calls): a word left by an earlier call never passes. The area is double-buffered by the
// epoch's parity: a rank can only run one call ahead of a peer (its next call waits for the
// peer's words of the current one, which the peer sends after it has read everything of the
// previous call), so a fast rank never overwrites words a slow one has yet to read.
// The stores are relaxed and the loads acquire: a word carries its own validity, and an
// acquire load is ordered before the stores this rank makes later (into the same area).
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;
constexpr int THREADS = 256;
constexpr int MAX_LOCAL = 4096;  // experts per rank (shared-memory sums)
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Peers {
  unsigned long long* ws[MAX_RANKS];
};

__device__ __forceinline__ void st_relaxed_sys64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_sys64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin until the word's epoch reaches `epoch`; returns its value
__device__ int wait_word(const unsigned long long* p, uint32_t epoch) {
  unsigned long long v = ld_acquire_sys64(p);
  const uint64_t start = now_ns();
  while ((uint32_t)(v >> 32) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
    v = ld_acquire_sys64(p);
  }
  return (int)(uint32_t)v;
}

// word (parity, source, w) of a rank's area; w = 0: the token count, w = 1 + j: local expert j
__device__ __forceinline__ size_t word(int par, int src, int w, int world, int stride) {
  return ((size_t)par * world + src) * stride + w;
}

__global__ void __launch_bounds__(THREADS) notify_dispatch(
    const int* __restrict__ tokens_per_rank, const int* __restrict__ tokens_per_expert,
    int world, int rank, int local, Peers peers, unsigned long long* own, uint32_t epoch,
    int* recv_from_rank, int* rank_prefix, int* num_recv_per_expert, int* num_recv) {
  __shared__ int sums[MAX_LOCAL];
  __shared__ int from[MAX_RANKS];
  const int stride = local + 1;
  const int par = epoch & 1;
  const int total = world * stride;
  for (int i = threadIdx.x; i < local; i += THREADS) sums[i] = 0;
  // publish: this rank's words for destination d go into d's area, row `rank`
  for (int i = threadIdx.x; i < total; i += THREADS) {
    const int d = i / stride, w = i % stride;
    const int value = w == 0 ? tokens_per_rank[d] : tokens_per_expert[(size_t)d * local + w - 1];
    st_relaxed_sys64(peers.ws[d] + word(par, rank, w, world, stride),
                     ((unsigned long long)epoch << 32) | (uint32_t)value);
  }
  __syncthreads();  // sums are zero
  // collect: every source's words of this call, from this rank's own area
  for (int i = threadIdx.x; i < total; i += THREADS) {
    const int s = i / stride, w = i % stride;
    const int value = wait_word(own + word(par, s, w, world, stride), epoch);
    if (w == 0) from[s] = value;
    else atomicAdd(&sums[w - 1], value);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < local; i += THREADS) num_recv_per_expert[i] = sums[i];
  if (threadIdx.x < world) {
    const int s = threadIdx.x;
    int before = 0;
    for (int p = 0; p < s; ++p) before += from[p];
    recv_from_rank[s] = from[s];
    rank_prefix[s] = before;
    if (s == world - 1) *num_recv = before + from[s];
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: num_tokens_per_rank, num_tokens_per_expert, recv_from_rank,
  // rank_prefix, num_recv_per_expert, num_recv (no params)
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = (int64_t)(ctx->buffer_bytes[1] / sizeof(int32_t));
  const int64_t local_experts = num_experts / world;  // experts per rank
  const int32_t* num_tokens_per_rank = (const int32_t*)ctx->buffers[0];    // (world,) input
  const int32_t* num_tokens_per_expert = (const int32_t*)ctx->buffers[1];  // (num_experts,) input
  int32_t* recv_from_rank = (int32_t*)ctx->buffers[2];       // (world,) output
  int32_t* rank_prefix = (int32_t*)ctx->buffers[3];          // (world,) output
  int32_t* num_recv_per_expert = (int32_t*)ctx->buffers[4];  // (local_experts,) output
  int32_t* num_recv = (int32_t*)ctx->buffers[5];             // (1,) output
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before the
  // first call, IPC-shared, kept across calls; ctx->peer_buffers[r][i]: rank r's buffer i
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || num_experts < world || num_experts % world ||
      local_experts > MAX_LOCAL)
    return 2;
  const size_t need = 2 * (size_t)world * (size_t)(local_experts + 1) * sizeof(unsigned long long);
  if (ctx->workspace == nullptr || ctx->workspace_bytes < need) return 3;
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  ++epoch;
  Peers peers;
  for (int r = 0; r < MAX_RANKS; ++r)
    peers.ws[r] = r < world ? (unsigned long long*)ctx->peer_workspace[r] : nullptr;
  notify_dispatch<<<1, THREADS, 0, stream>>>(
      num_tokens_per_rank, num_tokens_per_expert, world, rank, (int)local_experts, peers,
      (unsigned long long*)ctx->workspace, epoch, recv_from_rank, rank_prefix,
      num_recv_per_expert, num_recv);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
