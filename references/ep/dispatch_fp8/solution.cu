// MoE expert-parallel dispatch over NVLink with a float8 payload (DeepEP-style, intranode):
// every rank quantizes its tokens to float8 e4m3 with one scale per 128 channels and sends
// each token to the ranks that host its experts, with kernels that write straight into the
// peers' buffers through CUDA IPC.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (DeepEP's intranode dispatch without its channels, the payload quantized on the way):
//   1. layout (one block): every token's destination mask from topk_idx; per destination a
//      block-wide exclusive scan gives each token its index among this rank's tokens for that
//      destination (route[d][t], -1 when t does not go to d) and the totals cnt[d];
//   2. notify (same block): this rank's count row is stored into every rank's workspace with
//      a release store, the epoch in the high word (one 64-bit store: the flag and the data
//      cannot be seen apart); then it waits for every rank's row. With the full count matrix
//      cnt[s][d], this rank's rows start at base[d] = sum over s < rank of cnt[s][d] in rank
//      d's layout, and it received num_recv = sum over s of cnt[s][rank];
//   3. payload (grid): a warp per (token, 512-channel chunk): lane l loads channels
//      [128 u + 4 l, +4) of each of the chunk's (up to) four 128-channel groups u as one
//      16-byte vector, the warp reduces each group's amax with shuffles, every lane scales
//      and rounds its values to e4m3 (saturating) and stores them, 4 bytes per group, into
//      recv_x of every destination at base[d] + route[d][t]; lane u stores group u's scale;
//      the chunk-0 warp also writes the recv_src row (rank, t). A token is read and
//      quantized once, whatever the number of its destinations;
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
constexpr int GROUP = 128;                 // channels per scale
constexpr int UNROLL = 4;                  // groups per chunk: a chunk is 512 channels
constexpr int CHUNK = 32 * UNROLL;         // float4 vectors per chunk
constexpr float E4M3_MAX = 448.f;
constexpr float AMAX_FLOOR = 1e-4f;        // the smallest amax a scale is made from
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
  uint32_t* recv_x[MAX_RANKS];     // e4m3 bytes, four at a time
  float* recv_scales[MAX_RANKS];
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

__device__ __forceinline__ float amax4(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// one value to float8 e4m3: round to nearest even, saturating at +-448
__device__ __forceinline__ uint32_t to_e4m3(float v) {
  return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// four values (v * inv) to e4m3 bytes, the first in the lowest byte (the lowest address)
__device__ __forceinline__ uint32_t quantize4(float4 v, float inv) {
  return to_e4m3(v.x * inv) | (to_e4m3(v.y * inv) << 8) | (to_e4m3(v.z * inv) << 16) |
         (to_e4m3(v.w * inv) << 24);
}

// steps 3 and 4; hv = H / 4 vectors per row (a multiple of 32: H is a multiple of 128)
__global__ void __launch_bounds__(THREADS) payload_fp8(
    const float4* __restrict__ x, int T, int hv, int world, int rank, Workspace* ws,
    const int* __restrict__ route, Peers peers, uint32_t epoch) {
  const int lane = threadIdx.x & 31;
  const int base = lane < world ? ws->base[lane] : 0;
  const int groups_per_row = hv / 32;
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
    const int groups = min(UNROLL, groups_per_row - c * UNROLL);  // the same for the warp
    const float4* src = x + (size_t)t * hv + (size_t)c * CHUNK + lane;
    float4 v[UNROLL];
    float amax[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u < groups) {
        v[u] = __ldg(src + u * 32);
        amax[u] = amax4(v[u]);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u < groups) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
          amax[u] = fmaxf(amax[u], __shfl_xor_sync(0xffffffffu, amax[u], off));
      }
    uint32_t q[UNROLL];
    float my_scale = 0.f;  // lane u: group u's scale
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u < groups) {
        const float scale = fmaxf(amax[u], AMAX_FLOOR) / E4M3_MAX;
        q[u] = quantize4(v[u], 1.f / scale);
        if (lane == u) my_scale = scale;
      }
    uint32_t to = __ballot_sync(0xffffffffu, row >= 0);  // destinations, bit d (uniform)
    while (to) {
      const int d = __ffs(to) - 1;
      to &= to - 1;
      const int r = __shfl_sync(0xffffffffu, row, d);
      uint32_t* dst = peers.recv_x[d] + (size_t)r * hv + (size_t)c * CHUNK + lane;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (u < groups) dst[u * 32] = q[u];
      if (lane < groups)
        peers.recv_scales[d][(size_t)r * groups_per_row + (size_t)c * UNROLL + lane] = my_scale;
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
  // buffers, in this order: x, topk_idx, recv_x, recv_scales, recv_src, num_recv;
  // params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  // shapes (the same on every rank): T tokens per rank, H channels per token (a multiple of
  // 128), topk experts per token, H / 128 scales per token
  const int64_t T = (int64_t)(ctx->buffer_bytes[4] / (2 * sizeof(int64_t) * (size_t)world));
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* x = (const float*)ctx->buffers[0];             // (T, H) this rank's tokens
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[1];  // (T, topk) their experts
  int64_t* num_recv = (int64_t*)ctx->buffers[5];              // (1,) this rank's row count
  // rank r's recv_x (world*T, H) uint8 (e4m3 bits), recv_scales (world*T, H/128) float and
  // recv_src (world*T, 2) int64, mapped on this GPU (r == rank included):
  // ctx->peer_buffers[r][2], ctx->peer_buffers[r][3] and ctx->peer_buffers[r][4]
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before
  // the first call, IPC-shared, kept across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || T < 1 || T > (1 << 30) || H < GROUP || H % GROUP ||
      topk < 1 || num_experts < world || num_experts % world)
    return 2;
  const size_t need = ROUTE_OFFSET + (size_t)world * T * sizeof(int);
  if (ctx->workspace == nullptr || ctx->workspace_bytes < need) return 3;
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  static int sms = 0, per_sm = 0;  // resident blocks: one wave at most
  if (!sms) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, payload_fp8, THREADS, 0) != cudaSuccess)
      return 4;
  }
  ++epoch;

  Peers peers;
  for (int r = 0; r < MAX_RANKS; ++r) {
    const bool in = r < world;
    peers.ws[r] = in ? (Workspace*)ctx->peer_workspace[r] : nullptr;
    peers.recv_x[r] = in ? (uint32_t*)ctx->peer_buffers[r][2] : nullptr;
    peers.recv_scales[r] = in ? (float*)ctx->peer_buffers[r][3] : nullptr;
    peers.recv_src[r] = in ? (longlong2*)ctx->peer_buffers[r][4] : nullptr;
  }
  Workspace* ws = (Workspace*)ctx->workspace;
  int* route = (int*)((char*)ctx->workspace + ROUTE_OFFSET);

  layout_notify<<<1, LAYOUT_THREADS, 0, stream>>>(
      (const long long*)topk_idx, (int)T, (int)topk, (int)(num_experts / world), world, rank, ws,
      route, peers, epoch, (long long*)num_recv);

  const long long hv = H / 4;
  const long long chunks = (hv + CHUNK - 1) / CHUNK;
  long long blocks = (T * chunks + WARPS - 1) / WARPS;
  const long long wave = (long long)sms * (per_sm > 0 ? per_sm : 1);
  if (blocks > wave) blocks = wave;
  payload_fp8<<<(unsigned)blocks, THREADS, 0, stream>>>(
      (const float4*)x, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
