// MoE expert-parallel combine over NVLink (DeepEP-style, intranode): every token's expert
// outputs come back from the ranks it was dispatched to and are summed, with kernels that
// access the peers' buffers directly through CUDA IPC.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// mutant: the own rank's rows are taken to be in place already and skipped: tokens lose
// their local experts' contribution
// Design: a pull. The source of a token knows where its rows are: dispatch placed them in
// every destination d in d's layout (source rank ascending, then token index), so token t
// of this rank sits at row base[d] + route[d][t] of d's y, where route[d][t] is t's index
// among this rank's tokens that go to d and base[d] the number of tokens that lower ranks
// sent to d. So:
//   1. layout (one block): route[d][t] and this rank's per-destination counts from its own
//      topk_idx, exactly as a dispatch computes them;
//   2. notify (same block): every rank stores its count row into every rank's workspace (a
//      release store, the epoch in the high word of the same 64-bit word) and waits for all
//      rows; the full count matrix gives base[d]. Arriving here also tells the peers that
//      this rank's y is ready (everything its stream did before is visible to them);
//   3. pull (grid): a warp per (token, 2-KiB chunk of the row) loads the chunk of every
//      destination's y row (two sources in flight at a time, 16-byte vectors, over NVLink
//      for the peers), adds them in float32 (in rank order) and stores the sum into out;
//   4. end barrier: the last block to finish tells every peer "I am done reading your y" and
//      waits for the same from all of them, so no rank's stream moves on (and lets its y be
//      overwritten) while a peer still reads it.
// No rank writes into a peer's buffers: only flags and counts cross over. Flags are call
// numbers kept on the host (every rank makes the same calls); count rows are double-buffered
// by epoch parity and the end barrier keeps ranks within one call of each other.
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;  // destination masks fit in 32 bits
constexpr int LAYOUT_THREADS = 1024;
constexpr int LAYOUT_WARPS = LAYOUT_THREADS / 32;  // 32: one warp scans the warp counts
static_assert(LAYOUT_WARPS == 32, "the warp-count scan uses one lane per warp");
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int UNROLL = 4;  // vectors per lane per chunk and source: 32 * 4 vectors (2 KiB)
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Workspace {
  unsigned long long counts[2][MAX_RANKS][MAX_RANKS];  // [parity][source][dest]: epoch<<32 | n
  uint32_t done[MAX_RANKS];       // [reader]: the last call in which that rank finished reading
  uint32_t retired;               // pull blocks finished in this call (reset by the last)
  int32_t base[MAX_RANKS];        // [dest]: where this rank's tokens start in dest's layout
};
constexpr size_t ROUTE_OFFSET = (sizeof(Workspace) + 255) / 256 * 256;  // then int32 route[d][t]

struct Peers {
  Workspace* ws[MAX_RANKS];
  const void* y[MAX_RANKS];
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
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

// spin until the epoch in the high word reaches `epoch`; returns the word
__device__ unsigned long long wait_row(const unsigned long long* p, uint32_t epoch) {
  unsigned long long v = ld_acquire_sys64(p);
  const uint64_t start = now_ns();
  while ((uint32_t)(v >> 32) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
    v = ld_acquire_sys64(p);
  }
  return v;
}
__device__ void wait_flag(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// steps 1 and 2: one block (as in a dispatch: the same routing gives the same layout)
__global__ void __launch_bounds__(LAYOUT_THREADS) layout_notify(
    const long long* __restrict__ topk_idx, int T, int topk, int per_rank, int world, int rank,
    Workspace* ws, int* __restrict__ route, Peers peers, uint32_t epoch) {
  __shared__ int warp_pos[LAYOUT_WARPS][MAX_RANKS];
  __shared__ int total[MAX_RANKS];
  __shared__ int cnt[MAX_RANKS][MAX_RANKS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t below = (1u << lane) - 1u;
  if (tid < MAX_RANKS) total[tid] = 0;
  __syncthreads();
  for (int first = 0; first < T; first += LAYOUT_THREADS) {  // tiles of 1024 tokens
    const int t = first + tid;
    uint32_t mask = 0;
    if (t < T) {
      const long long* e = topk_idx + (size_t)t * topk;
      for (int k = 0; k < topk; ++k) mask |= 1u << ((int)e[k] / per_rank);
    }
    for (int d = 0; d < world; ++d) {
      const uint32_t b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (lane == 0) warp_pos[warp][d] = __popc(b);
    }
    __syncthreads();
    if (warp < world) {  // warp d: exclusive scan of the 32 warp counts, after earlier tiles
      const int d = warp;
      const int c = warp_pos[lane][d];
      int incl = c;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += n;
      }
      const int before = total[d];
      __syncwarp();
      warp_pos[lane][d] = before + incl - c;
      if (lane == 31) total[d] = before + incl;
    }
    __syncthreads();
    for (int d = 0; d < world; ++d) {
      const uint32_t b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (t < T) route[(size_t)d * T + t] = (mask >> d) & 1u ? warp_pos[warp][d] + __popc(b & below) : -1;
    }
    __syncthreads();  // warp_pos is reused by the next tile
  }
  // notify: this rank's row of the count matrix, into every rank's workspace
  const int par = epoch & 1;
  for (int i = tid; i < world * world; i += LAYOUT_THREADS) {
    const int p = i / world, d = i % world;
    st_release_sys64(&peers.ws[p]->counts[par][rank][d],
                     ((unsigned long long)epoch << 32) | (uint32_t)total[d]);
  }
  for (int i = tid; i < world * world; i += LAYOUT_THREADS) {
    const int s = i / world, d = i % world;
    cnt[s][d] = (int)(uint32_t)wait_row(&ws->counts[par][s][d], epoch);
  }
  __syncthreads();
  if (tid < world) {
    int b = 0;
    for (int s = 0; s < rank; ++s) b += cnt[s][tid];
    ws->base[tid] = b;
  }
}

__device__ __forceinline__ float4 add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float add(float a, float b) { return a + b; }
template <typename V> __device__ __forceinline__ V zero();
template <> __device__ __forceinline__ float4 zero<float4>() { return make_float4(0.f, 0.f, 0.f, 0.f); }
template <> __device__ __forceinline__ float zero<float>() { return 0.f; }

// steps 3 and 4; V is float4 when rows are whole 16-byte vectors (H % 4 == 0), else float
template <typename V>
__global__ void __launch_bounds__(THREADS) pull_sum(
    V* __restrict__ out, int T, int hv, int world, int rank, Workspace* ws,
    const int* __restrict__ route, Peers peers, uint32_t epoch) {
  const int lane = threadIdx.x & 31;
  const int base = lane < world ? ws->base[lane] : 0;
  constexpr int CHUNK = 32 * UNROLL;
  const int chunks = (hv + CHUNK - 1) / CHUNK;
  const long long items = (long long)T * chunks;
  const long long stride = (long long)gridDim.x * WARPS;
  for (long long it = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5); it < items; it += stride) {
    const int t = (int)(it / chunks), c = (int)(it % chunks);
    int row = -1;  // lane d: token t's row in rank d's y (-1: t was not dispatched to d)
    if (lane < world) {
      const int r = route[(size_t)lane * T + t];
      if (r >= 0) row = base + r;
    }
    const size_t off = (size_t)c * CHUNK + lane;
    const int left = hv - c * CHUNK - lane;  // vectors of this chunk at or after this lane's first
    V acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = zero<V>();
    uint32_t from = __ballot_sync(0xffffffffu, row >= 0) & ~(1u << rank);  // peers only
    while (from) {
      const int d0 = __ffs(from) - 1;
      from &= from - 1;
      const V* a = reinterpret_cast<const V*>(peers.y[d0]) +
                   (size_t)__shfl_sync(0xffffffffu, row, d0) * hv + off;
      V va[UNROLL];
      if (from) {  // two rows in flight at once
        const int d1 = __ffs(from) - 1;
        from &= from - 1;
        const V* b = reinterpret_cast<const V*>(peers.y[d1]) +
                     (size_t)__shfl_sync(0xffffffffu, row, d1) * hv + off;
        V vb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (u * 32 < left) {
            va[u] = a[u * 32];
            vb[u] = b[u * 32];
          }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (u * 32 < left) acc[u] = add(add(acc[u], va[u]), vb[u]);
      } else {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (u * 32 < left) va[u] = a[u * 32];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (u * 32 < left) acc[u] = add(acc[u], va[u]);
      }
    }
    V* dst = out + (size_t)t * hv + off;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u * 32 < left) dst[u * 32] = acc[u];
  }
  // end barrier: the last block to finish signals every peer, then waits for all of them
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&ws->retired, 1u) == gridDim.x - 1;
    if (last) {
      atomicExch(&ws->retired, 0u);  // every block has counted: ready for the next call
      __threadfence_system();
    }
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < world) {
    const int p = threadIdx.x;
    st_release_sys(&peers.ws[p]->done[rank], epoch);
    wait_flag(&ws->done[p], epoch);
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: y, recv_src, topk_idx, out; params: num_experts, hidden, topk
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  const int64_t n_recv = (int64_t)(ctx->buffer_bytes[1] / (2 * sizeof(int64_t)));  // y rows here
  int64_t H = ctx->num_params >= 2 ? ctx->params[1] : 0;  // floats per token
  if (ctx->num_params < 2) {
    // a harness that passes num_experts only: take H from a rank that holds y rows (all ranks
    // take this branch in every call, so the host exchange pairs up)
    int64_t mine = n_recv > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)n_recv)) : 0;
    int64_t every[COMMBENCH_MAX_RANKS] = {0};
    if (ctx->allgather(ctx->host, &mine, sizeof mine, every) != 0) return 90;
    for (int r = 0; r < world; ++r) H = every[r] > 0 ? every[r] : H;
  }
  // shapes (the same on every rank): T tokens per rank, topk experts per token
  const int64_t T = H > 0 ? (int64_t)(ctx->buffer_bytes[3] / (sizeof(float) * (size_t)H)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[2] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* y = (const float*)ctx->buffers[0];               // (n_recv, H) this rank's rows
  const int64_t* recv_src = (const int64_t*)ctx->buffers[1];    // (n_recv, 2) their (src, token)
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[2];    // (T, topk) own tokens' experts
  float* out = (float*)ctx->buffers[3];                          // (T, H) this rank's result
  // rank r's y and recv_src, mapped on this GPU (r == rank included): ctx->peer_buffers[r][0]
  // and ctx->peer_buffers[r][1] (their row counts differ from rank to rank)
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before
  // the first call, IPC-shared, kept across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)y; (void)recv_src;  // the routing says where every row is: recv_src is not needed
  if (world < 1 || world > MAX_RANKS || H < 1 || T < 1 || T > (1 << 30) || topk < 1 ||
      num_experts < world || num_experts % world)
    return 2;
  const size_t need = ROUTE_OFFSET + (size_t)world * T * sizeof(int);
  if (ctx->workspace == nullptr || ctx->workspace_bytes < need) return 3;
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  static int sms = 0, per_sm_vec = 0, per_sm_one = 0;  // resident blocks: one wave at most
  if (!sms) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_vec, pull_sum<float4>, THREADS, 0) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_one, pull_sum<float>, THREADS, 0) != cudaSuccess)
      return 4;
  }
  ++epoch;

  Peers peers;
  for (int r = 0; r < MAX_RANKS; ++r) {
    const bool in = r < world;
    peers.ws[r] = in ? (Workspace*)ctx->peer_workspace[r] : nullptr;
    peers.y[r] = in ? ctx->peer_buffers[r][0] : nullptr;
  }
  Workspace* ws = (Workspace*)ctx->workspace;
  int* route = (int*)((char*)ctx->workspace + ROUTE_OFFSET);

  layout_notify<<<1, LAYOUT_THREADS, 0, stream>>>(
      (const long long*)topk_idx, (int)T, (int)topk, (int)(num_experts / world), world, rank, ws,
      route, peers, epoch);

  const bool vec = H % 4 == 0;
  const long long hv = vec ? H / 4 : H;
  const long long chunks = (hv + 32 * UNROLL - 1) / (32 * UNROLL);
  long long blocks = (T * chunks + WARPS - 1) / WARPS;
  const int per_sm = vec ? per_sm_vec : per_sm_one;
  const long long wave = (long long)sms * (per_sm > 0 ? per_sm : 1);
  if (blocks > wave) blocks = wave;
  if (vec)
    pull_sum<float4><<<(unsigned)blocks, THREADS, 0, stream>>>(
        (float4*)out, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  else
    pull_sum<float><<<(unsigned)blocks, THREADS, 0, stream>>>(
        out, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
