// MoE expert-parallel dispatch over NVLink (DeepEP-style, intranode): every rank sends each of
// its tokens to the ranks that host the token's experts, with kernels that write straight into
// the peers' buffers through CUDA IPC.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (DeepEP's intranode dispatch, without its channels: each rank has the whole peer
// buffers mapped, so rows go straight to their final place):
//   1. layout (one block): every token's destination mask from topk_idx; per destination a
//      block-wide exclusive scan gives each token its index among this rank's tokens for that
//      destination (route[d][t], -1 when t does not go to d) and the totals cnt[d];
//   2. notify (same block): this rank's count row is stored into every rank's workspace with
//      a release store, the epoch in the high word (one 64-bit store: the flag and the data
//      cannot be seen apart); then it waits for every rank's row. With the full count matrix
//      cnt[s][d], this rank's rows start at base[d] = sum over s < rank of cnt[s][d] in rank
//      d's layout, and it received num_recv = sum over s of cnt[s][rank];
//   3. payload (grid): a warp per (token, 2-KiB chunk of the row) loads the chunk once from x
//      (16-byte vectors) and stores it into recv_x of every destination at base[d] +
//      route[d][t]; the chunk-0 warp also writes the recv_src row (rank, t);
//   4. end barrier: every block fences its stores at system scope and retires on a counter;
//      the last block tells every peer "my rows are in your buffers" and waits for the same
//      from every peer, so when this rank's stream is done its recv buffers are complete.
// Flags are call numbers kept on the host (every rank makes the same calls, so they agree,
// and they grow, so a word left by an earlier call never passes a wait). The count rows are
// double-buffered by epoch parity and the end barrier keeps ranks within one call of each
// other, so a fast rank never overwrites a row a slow one has yet to read.
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;  // destination masks fit in 32 bits
constexpr int LAYOUT_THREADS = 1024;
constexpr int LAYOUT_WARPS = LAYOUT_THREADS / 32;  // 32: one warp scans the warp counts
static_assert(LAYOUT_WARPS == 32, "the warp-count scan uses one lane per warp");
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int UNROLL = 4;  // vectors per lane per chunk: a chunk is 32 * 4 vectors (2 KiB)
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Workspace {
  unsigned long long counts[2][MAX_RANKS][MAX_RANKS];  // [parity][source][dest]: epoch<<32 | n
  uint32_t done[MAX_RANKS];       // [source]: the last call whose rows that rank has delivered
  uint32_t retired;               // payload blocks finished in this call (reset by the last)
  int32_t base[MAX_RANKS];        // [dest]: where this rank's rows start in dest's layout
};
constexpr size_t ROUTE_OFFSET = (sizeof(Workspace) + 255) / 256 * 256;  // then int32 route[d][t]

struct Peers {
  Workspace* ws[MAX_RANKS];
  void* recv_x[MAX_RANKS];
  longlong2* recv_src[MAX_RANKS];
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

// steps 1 and 2: one block
__global__ void __launch_bounds__(LAYOUT_THREADS) layout_notify(
    const long long* __restrict__ topk_idx, int T, int topk, int per_rank, int world, int rank,
    Workspace* ws, int* __restrict__ route, Peers peers, uint32_t epoch, long long* num_recv) {
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
  if (tid == 0) {
    long long n = 0;
    for (int s = 0; s < world; ++s) n += cnt[s][rank];
    *num_recv = n;
  }
}

// steps 3 and 4; V is float4 when rows are whole 16-byte vectors (H % 4 == 0), else float
template <typename V>
__global__ void __launch_bounds__(THREADS) payload(
    const V* __restrict__ x, int T, int hv, int world, int rank, Workspace* ws,
    const int* __restrict__ route, Peers peers, uint32_t epoch) {
  const int lane = threadIdx.x & 31;
  const int base = lane < world ? ws->base[lane] : 0;
  constexpr int CHUNK = 32 * UNROLL;
  const int chunks = (hv + CHUNK - 1) / CHUNK;
  const long long items = (long long)T * chunks;
  const long long stride = (long long)gridDim.x * WARPS;
  for (long long it = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5); it < items; it += stride) {
    const int t = (int)(it / chunks), c = (int)(it % chunks);
    int row = -1;  // lane d: token t's row in rank d's layout (-1: not sent there)
    if (lane < world) {
      const int r = route[(size_t)lane * T + t];
      if (r >= 0) row = base + r;
    }
    const V* src = x + (size_t)t * hv + (size_t)c * CHUNK + lane;
    const int left = hv - c * CHUNK - lane;  // vectors of this chunk at or after this lane's first
    V v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u * 32 < left) v[u] = __ldg(src + u * 32);
    uint32_t to = __ballot_sync(0xffffffffu, row >= 0);  // destinations, bit d (uniform)
    while (to) {
      const int d = __ffs(to) - 1;
      to &= to - 1;
      const int r = __shfl_sync(0xffffffffu, row, d);
      V* dst = reinterpret_cast<V*>(peers.recv_x[d]) + (size_t)r * hv + (size_t)c * CHUNK + lane;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (u * 32 < left) dst[u * 32] = v[u];
    }
    if (c == 0 && row >= 0) peers.recv_src[lane][row] = make_longlong2(rank, t);
  }
  // end barrier: the last block to finish signals every peer, then waits for all of them
  __threadfence_system();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
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
  // buffers, in this order: x, topk_idx, recv_x, recv_src, num_recv; params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  // shapes (the same on every rank): T tokens per rank, H floats per token, topk experts each
  const int64_t T = (int64_t)(ctx->buffer_bytes[3] / (2 * sizeof(int64_t) * (size_t)world));
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* x = (const float*)ctx->buffers[0];             // (T, H) this rank's tokens
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[1];  // (T, topk) their experts
  int64_t* num_recv = (int64_t*)ctx->buffers[4];              // (1,) this rank's row count
  // rank r's recv_x (world*T, H) float and recv_src (world*T, 2) int64, mapped on this GPU
  // (r == rank included): ctx->peer_buffers[r][2] and ctx->peer_buffers[r][3]
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before
  // the first call, IPC-shared, kept across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || T < 1 || T > (1 << 30) || H < 1 || topk < 1 ||
      num_experts < world || num_experts % world)
    return 2;
  const size_t need = ROUTE_OFFSET + (size_t)world * T * sizeof(int);
  if (ctx->workspace == nullptr || ctx->workspace_bytes < need) return 3;
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  static int sms = 0, per_sm_vec = 0, per_sm_one = 0;  // resident blocks: one wave at most
  if (!sms) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_vec, payload<float4>, THREADS, 0) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_one, payload<float>, THREADS, 0) != cudaSuccess)
      return 4;
  }
  ++epoch;

  Peers peers;
  for (int r = 0; r < MAX_RANKS; ++r) {
    const bool in = r < world;
    peers.ws[r] = in ? (Workspace*)ctx->peer_workspace[r] : nullptr;
    peers.recv_x[r] = in ? ctx->peer_buffers[r][2] : nullptr;
    peers.recv_src[r] = in ? (longlong2*)ctx->peer_buffers[r][3] : nullptr;
  }
  Workspace* ws = (Workspace*)ctx->workspace;
  int* route = (int*)((char*)ctx->workspace + ROUTE_OFFSET);

  layout_notify<<<1, LAYOUT_THREADS, 0, stream>>>(
      (const long long*)topk_idx, (int)T, (int)topk, (int)(num_experts / world), world, rank, ws,
      route, peers, epoch, (long long*)num_recv);

  const bool vec = H % 4 == 0;
  const long long hv = vec ? H / 4 : H;
  const long long chunks = (hv + 32 * UNROLL - 1) / (32 * UNROLL);
  long long blocks = (T * chunks + WARPS - 1) / WARPS;
  const int per_sm = vec ? per_sm_vec : per_sm_one;
  const long long wave = (long long)sms * (per_sm > 0 ? per_sm : 1);
  if (blocks > wave) blocks = wave;
  if (vec)
    payload<float4><<<(unsigned)blocks, THREADS, 0, stream>>>(
        (const float4*)x, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  else
    payload<float><<<(unsigned)blocks, THREADS, 0, stream>>>(
        x, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
