// MoE expert-parallel dispatch over xGMI (DeepEP-style, intranode, AMD Instinct): every rank
// sends each of its tokens to the ranks that host the token's experts, with kernels that
// write straight into the peers' buffers through HIP IPC.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Plan (DeepEP's intranode dispatch without its channels: every peer's recv buffers are
// mapped here, so each row is stored once, straight at its final place):
//   1. layout (one block of 1024 threads): each token's destination-rank mask from topk_idx;
//      per destination a block-wide exclusive scan (wave ballots, then one wave scanning the
//      per-wave counts) gives route[d][t], t's index among this rank's tokens bound for d
//      (-1 when t does not go there), and the totals cnt[d];
//   2. notify (same block): this rank's count row goes into every rank's workspace as 64-bit
//      release stores at system scope, the call number in the high word (flag and count in
//      one word, so they cannot be seen apart); then it waits, with system-scope acquire
//      loads of its own workspace, for every rank's row. From the matrix cnt[s][d]: this
//      rank's rows start at base[d] = sum over s < rank of cnt[s][d] in rank d's layout, and
//      it receives num_recv = sum over s of cnt[s][rank]. Every peer having published its
//      row for this call also means every peer's stream has reached this call;
//   3. payload (grid): one wave per (token, chunk of warpSize * UNROLL 16-byte vectors); the
//      chunk is read once from x and stored to every destination's recv_x over xGMI; the
//      chunk-0 wave also stores the (rank, token) pair into recv_src;
//   4. completion: each block fences at system scope (its stores leave this GPU's L2) and
//      retires on a device counter; the last one release-stores "my rows are in your buffer"
//      into every peer's workspace and acquire-waits for the same word from every peer.
// The wave width is read at run time (warpSize: 64 on gfx942, 32 where the source is built
// for an NVIDIA GPU), so ballots are 64-bit masks and shared arrays are sized for the
// narrowest wave. Only plain stores and release stores cross the link (no remote
// read-modify-write), and every wait reads this GPU's own workspace. Flags are call numbers
// kept on the host (the same on every rank, always growing); the count rows alternate by the
// parity of the call, and the completion barrier keeps ranks within one call of each other,
// so a fast rank never overwrites a row that a slow one has yet to read.
#include <assert.h>

constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;  // destination masks fit in 32 bits
constexpr int LAYOUT_THREADS = 1024;
constexpr int MIN_WAVE = 32;                             // the narrowest wave this runs on
constexpr int MAX_WAVES = LAYOUT_THREADS / MIN_WAVE;     // 32: at most one wave's lanes
constexpr int THREADS = 256;
constexpr int UNROLL = 4;  // 16-byte vectors per lane per chunk
// a lost peer traps rather than hangs: 2^35 shader cycles, some 16 s at 2.1 GHz
constexpr uint64_t WAIT_LIMIT_CYCLES = 1ull << 35;

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

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void store_release_sys(unsigned long long* p, unsigned long long v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint32_t load_acquire_sys(uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ unsigned long long load_acquire_sys(unsigned long long* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint64_t cycles() { return (uint64_t)clock64(); }

// spin until the call number in the high word reaches `epoch`; returns the word
__device__ unsigned long long wait_row(unsigned long long* p, uint32_t epoch) {
  unsigned long long v = load_acquire_sys(p);
  const uint64_t start = cycles();
  while ((uint32_t)(v >> 32) < epoch) {
    __builtin_amdgcn_s_sleep(1);
    if (cycles() - start > WAIT_LIMIT_CYCLES) {
      assert(!"a peer never published its counts");  // aborts the kernel (both builds)
      break;
    }
    v = load_acquire_sys(p);
  }
  return v;
}
__device__ void wait_flag(uint32_t* p, uint32_t epoch) {
  const uint64_t start = cycles();
  while (load_acquire_sys(p) < epoch) {
    __builtin_amdgcn_s_sleep(1);
    if (cycles() - start > WAIT_LIMIT_CYCLES) {
      assert(!"a peer never signalled");
      break;
    }
  }
}

// steps 1 and 2: one block
__global__ void __launch_bounds__(LAYOUT_THREADS) layout_notify(
    const long long* __restrict__ topk_idx, int T, int topk, int per_rank, int world, int rank,
    Workspace* ws, int* __restrict__ route, Peers peers, uint32_t epoch, long long* num_recv) {
  __shared__ int wave_cnt[MAX_WAVES][MAX_RANKS];  // tokens of each wave bound for each rank
  __shared__ int wave_off[MAX_WAVES][MAX_RANKS];  // where each wave's tokens start
  __shared__ int total[MAX_RANKS];                // tokens so far (earlier tiles) per rank
  __shared__ int cnt[MAX_RANKS][MAX_RANKS];
  const int W = warpSize;
  const int tid = threadIdx.x, lane = tid % W, wave = tid / W, waves = blockDim.x / W;
  const unsigned long long below = (1ull << lane) - 1ull;  // lanes under this one
  if (tid < MAX_RANKS) total[tid] = 0;
  __syncthreads();
  for (int first = 0; first < T; first += blockDim.x) {  // tiles of one token per thread
    const int t = first + tid;
    uint32_t mask = 0;
    if (t < T) {
      const long long* e = topk_idx + (size_t)t * topk;
      for (int k = 0; k < topk; ++k) mask |= 1u << ((int)e[k] / per_rank);
    }
    for (int d = 0; d < world; ++d) {
      const unsigned long long b = __ballot((mask >> d) & 1u);
      if (lane == 0) wave_cnt[wave][d] = (int)__popcll(b);
    }
    __syncthreads();
    if (wave < world) {  // wave d: exclusive scan of the per-wave counts, after earlier tiles
      const int d = wave;
      const int c = lane < waves ? wave_cnt[lane][d] : 0;
      int incl = c;
      for (int off = 1; off < W; off <<= 1) {
        const int n = __shfl_up(incl, off);
        if (lane >= off) incl += n;
      }
      if (lane < waves) wave_off[lane][d] = total[d] + incl - c;
    }
    __syncthreads();
    for (int d = 0; d < world; ++d) {
      const unsigned long long b = __ballot((mask >> d) & 1u);
      if (t < T)
        route[(size_t)d * T + t] = (mask >> d) & 1u ? wave_off[wave][d] + (int)__popcll(b & below) : -1;
    }
    if (tid < world) total[tid] = wave_off[waves - 1][tid] + wave_cnt[waves - 1][tid];
    __syncthreads();  // the wave tables are reused by the next tile
  }
  // notify: this rank's row of the count matrix, into every rank's workspace
  const int par = epoch & 1;
  for (int i = tid; i < world * world; i += blockDim.x) {
    const int p = i / world, d = i % world;
    store_release_sys(&peers.ws[p]->counts[par][rank][d],
                      ((unsigned long long)epoch << 32) | (uint32_t)total[d]);
  }
  for (int i = tid; i < world * world; i += blockDim.x) {
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
  const int W = warpSize;
  const int lane = threadIdx.x % W, waves = blockDim.x / W;
  const int base = lane < world ? ws->base[lane] : 0;
  const int chunk = W * UNROLL;  // vectors one wave moves per item
  const int chunks = (hv + chunk - 1) / chunk;
  const long long items = (long long)T * chunks;
  const long long stride = (long long)gridDim.x * waves;
  for (long long it = (long long)blockIdx.x * waves + threadIdx.x / W; it < items; it += stride) {
    const int t = (int)(it / chunks), c = (int)(it % chunks);
    int row = -1;  // lane d: token t's row in rank d's layout (-1: not sent there)
    if (lane < world) {
      const int r = route[(size_t)lane * T + t];
      if (r >= 0) row = base + r;
    }
    const V* src = x + (size_t)t * hv + (size_t)c * chunk + lane;
    const int left = hv - c * chunk - lane;  // vectors of this chunk at or after this lane's first
    V v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u * W < left) v[u] = src[u * W];
    unsigned long long to = __ballot(row >= 0);  // destinations, bit d (the same in every lane)
    while (to) {
      const int d = (int)__ffsll(to) - 1;
      to &= to - 1;
      const int r = __shfl(row, d);
      V* dst = reinterpret_cast<V*>(peers.recv_x[d]) + (size_t)r * hv + (size_t)c * chunk + lane;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (u * W < left) dst[u * W] = v[u];
    }
    if (c == 0 && row >= 0) peers.recv_src[lane][row] = make_longlong2(rank, t);
  }
  // completion: the last block to finish signals every peer, then waits for all of them
  __threadfence_system();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    last = __hip_atomic_fetch_add(&ws->retired, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT) ==
           gridDim.x - 1;
    if (last) __hip_atomic_store(&ws->retired, 0u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < world) {
    const int p = threadIdx.x;
    store_release_sys(&peers.ws[p]->done[rank], epoch);
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
  // through HIP IPC (r == rank included): ctx->peer_buffers[r][2] and ctx->peer_buffers[r][3]
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before
  // the first call, IPC-shared, kept across calls
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || T < 1 || T > (1 << 30) || H < 1 || topk < 1 ||
      num_experts < world || num_experts % world)
    return 2;
  const size_t need = ROUTE_OFFSET + (size_t)world * T * sizeof(int);
  if (ctx->workspace == nullptr || ctx->workspace_bytes < need) return 3;
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  static int cus = 0, wave = 0, per_cu_vec = 0, per_cu_one = 0;  // grids of one wave at most
  if (!cus) {
    int n = 0, w = 0, pv = 0, po = 0;
    if (hipDeviceGetAttribute(&n, hipDeviceAttributeMultiprocessorCount, ctx->device) != hipSuccess ||
        hipDeviceGetAttribute(&w, hipDeviceAttributeWarpSize, ctx->device) != hipSuccess ||
        hipOccupancyMaxActiveBlocksPerMultiprocessor(&pv, payload<float4>, THREADS, 0) != hipSuccess ||
        hipOccupancyMaxActiveBlocksPerMultiprocessor(&po, payload<float>, THREADS, 0) != hipSuccess ||
        n < 1 || w < MIN_WAVE || THREADS % w || LAYOUT_THREADS / w > w)
      return 4;
    cus = n, wave = w, per_cu_vec = pv, per_cu_one = po;
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

  hipLaunchKernelGGL(layout_notify, dim3(1), dim3(LAYOUT_THREADS), 0, stream,
                     (const long long*)topk_idx, (int)T, (int)topk, (int)(num_experts / world),
                     world, rank, ws, route, peers, epoch, (long long*)num_recv);

  const bool vec = H % 4 == 0;
  const long long hv = vec ? H / 4 : H;
  const long long chunks = (hv + wave * UNROLL - 1) / (wave * UNROLL);
  const long long per_block = THREADS / wave;
  long long blocks = (T * chunks + per_block - 1) / per_block;
  const int per_cu = vec ? per_cu_vec : per_cu_one;
  const long long full = (long long)cus * (per_cu > 0 ? per_cu : 1);
  if (blocks > full) blocks = full;
  if (vec)
    hipLaunchKernelGGL(payload<float4>, dim3((unsigned)blocks), dim3(THREADS), 0, stream,
                       (const float4*)x, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  else
    hipLaunchKernelGGL(payload<float>, dim3((unsigned)blocks), dim3(THREADS), 0, stream,
                       x, (int)T, (int)hv, world, rank, ws, route, peers, epoch);
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
