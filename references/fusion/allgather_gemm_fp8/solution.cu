// All-gather fused with a float8 GEMM at tile granularity: the rows of a float8 (e4m3) matrix
// A, each with its own float32 scale, are spread over the ranks, and every rank multiplies the
// whole scaled A by its own scaled float8 B. The row blocks of A (and their scales) travel
// between the GPUs through CUDA IPC, with per-block flags, while the GEMM is already running.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: as for float32 (one persistent kernel, all blocks resident; each block first pushes
// row blocks of its rank's shard into the peers' workspaces and flags them, then computes
// output tiles, its own rows first, waiting for a peer's row block flag before using it):
//   - a row block is 64 rows of e4m3 bytes plus their 64 float32 scales: both go into the
//     peer's gather slot for this rank before the flag, so a consumer scales every row with
//     the scale of the rank the row came from;
//   - the GEMM decodes e4m3 to float32 as it fills shared memory (the conversion is exact),
//     multiplies and accumulates in float32, and scales the finished sums: c = (sum) * sa[row]
//     * sb[col].
// Calls back to back: call counter as flag value (waits accept >= it), two halves of the
// gather area by the parity of the call (see the float32 task's reasoning: no rank gets more
// than one call ahead of a peer, so the half it writes is never the one a peer still reads).
constexpr int MAX_RANKS = 8;
constexpr int BM = 64, BN = 64, BK = 16;  // the output tile (and row block) and one k step
constexpr int THREADS = 256;              // 16 x 16 threads, 4 x 4 outputs each
constexpr int MAX_BLOCKS = 4096;          // flag slots per source rank (row blocks)
constexpr size_t FLAG_BYTES = (size_t)MAX_RANKS * MAX_BLOCKS * sizeof(uint32_t);
constexpr unsigned long long SPIN_LIMIT_NS = 20000000000ull;  // 20 s: a lost flag traps

struct Args {
  const uint8_t* a;  // this rank's shard (m, k), e4m3
  const float* sa;   // its row scales (m)
  const uint8_t* b;  // (k, n), e4m3
  const float* sb;   // column scales (n)
  float* c;          // (world * m, n)
  int64_t m, k, n;
  int64_t slot;       // bytes per source slot of a gather area: rows, then scales
  int64_t scales_at;  // where a slot's scales start (m * k rounded up to 16)
  int tiles_m, tiles_n;
  int rank, world;
  uint32_t epoch;
  uint8_t* gather[MAX_RANKS];  // rank r's gather half of this call, mapped here
  uint32_t* flags[MAX_RANKS];  // rank r's flags, mapped here: [source rank][row block]
};

struct __align__(16) Smem {
  float a[BK][BM + 4];  // the decoded A tile transposed (a[kk][row]); 16-byte aligned rows
  float b[BK][BN];
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin until *f has reached `epoch` (wrap-safe); trap if that takes longer than any
// honest wait could
__device__ __forceinline__ void wait_at_least(const uint32_t* f, uint32_t epoch) {
  if ((int32_t)(ld_acquire_sys(f) - epoch) >= 0) return;
  const unsigned long long start = globaltimer();
  while ((int32_t)(ld_acquire_sys(f) - epoch) < 0) {
    if (globaltimer() - start > SPIN_LIMIT_NS) __trap();
  }
}

__device__ __forceinline__ float e4m3(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3)));
}

// acc[i][j] += sum over kk < K of A[r][kk] * B[kk][col0 + c] (e4m3 values, float32 math),
// with r = ty*4 + i and c = tx*4 + j. A points at the tile's first row (lda bytes a row) and
// has `arows` valid rows; rows past them, columns past n and depths past K read as zeros.
// A is read through L2 (ld.global.cg: it may be rows a peer pushed during this call).
__device__ __forceinline__ void gemm_tile(const uint8_t* __restrict__ A, int64_t lda, int arows,
                                          const uint8_t* __restrict__ B, int64_t n, int64_t col0,
                                          int64_t K, Smem& sm, float acc[4][4]) {
  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int ak = tid & 15, ar = tid >> 4;  // A: rows ar + 16 l, depth ak
  const int bc = tid & 63, bk = tid >> 6;  // B: depths bk + 4 l, column bc
  float ra[4], rb[4];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int r = ar + 16 * l;
      const int64_t kk = k0 + ak;
      ra[l] = (r < arows && kk < K) ? e4m3(__ldcg(A + (int64_t)r * lda + kk)) : 0.f;
    }
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int64_t kk = k0 + bk + 4 * l;
      const int64_t col = col0 + bc;
      rb[l] = (kk < K && col < n) ? e4m3(__ldg(B + kk * n + col)) : 0.f;
    }
  };
  load(0);
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();  // the previous step (or tile) is done with the shared tiles
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      sm.a[ak][ar + 16 * l] = ra[l];
      sm.b[bk + 4 * l][bc] = rb[l];
    }
    __syncthreads();
    if (k0 + BK < K) load(k0 + BK);  // the next step's loads overlap this step's math
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&sm.a[kk][ty * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&sm.b[kk][tx * 4]);
      const float a4[4] = {av.x, av.y, av.z, av.w};
      const float b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a4[i], b4[j], acc[i][j]);
    }
  }
}

// copy this rank's row block rb (bytes and scales) into the gather area of `peer`, then flag it
__device__ __forceinline__ void push_rows(const Args& p, int peer, int rb) {
  const int tid = threadIdx.x;
  const int64_t row0 = (int64_t)rb * BM;
  const int64_t rows = p.m - row0 < BM ? p.m - row0 : BM;
  // rows row0.. are contiguous in the shard and in the slot; both start 16-byte aligned
  // (row0 * k is a multiple of 64, the slot a multiple of 16 bytes)
  const uint8_t* src = p.a + row0 * p.k;
  uint8_t* slot = p.gather[peer] + (int64_t)p.rank * p.slot;
  uint8_t* dst = slot + row0 * p.k;
  const int64_t len = rows * p.k;
  const int64_t vecs = len >> 4;
  const uint4* s16 = reinterpret_cast<const uint4*>(src);
  uint4* d16 = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
  for (int64_t v = tid; v < vecs; v += THREADS) d16[v] = __ldg(s16 + v);
  for (int64_t e = vecs * 16 + tid; e < len; e += THREADS) dst[e] = __ldg(src + e);
  if (tid < rows)
    reinterpret_cast<float*>(slot + p.scales_at)[row0 + tid] = __ldg(p.sa + row0 + tid);
  __syncthreads();  // the whole row block is stored before it is flagged
  if (tid == 0) {
    __threadfence_system();
    st_release_sys(p.flags[peer] + (size_t)p.rank * MAX_BLOCKS + rb, p.epoch);
  }
}

// one 64 x 64 tile of c: rows tm*64.. of source s's shard times columns tn*64.. of b, scaled
__device__ __forceinline__ void gemm_c_tile(const Args& p, int s, int tm, int tn, Smem& sm) {
  const int tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const uint8_t* A = p.a;
  const float* sa = p.sa;
  if (s != p.rank) {
    if (tid == 0) wait_at_least(p.flags[p.rank] + (size_t)s * MAX_BLOCKS + tm, p.epoch);
    __syncthreads();  // the acquired flag covers the whole block's reads of the rows
    const uint8_t* slot = p.gather[p.rank] + (int64_t)s * p.slot;
    A = slot;
    sa = reinterpret_cast<const float*>(slot + p.scales_at);
  }
  const int64_t row0 = (int64_t)tm * BM, col0 = (int64_t)tn * BN;
  const int rows = (int)(p.m - row0 < BM ? p.m - row0 : BM);
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  gemm_tile(A + row0 * p.k, p.k, rows, p.b, p.n, col0, p.k, sm, acc);
  const int64_t col = col0 + tx * 4;
  if (col >= p.n) return;
  float sc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) sc[j] = col + j < p.n ? __ldg(p.sb + col + j) : 0.f;
  const bool vec = (p.n & 3) == 0 && col + 3 < p.n;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i;
    if (r >= rows) continue;
    const float s_row = __ldcg(sa + row0 + r);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = acc[i][j] * s_row * sc[j];
    float* dst = p.c + ((int64_t)s * p.m + row0 + r) * p.n + col;
    if (vec) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      for (int j = 0; j < 4 && col + j < p.n; ++j) dst[j] = v[j];
    }
  }
}

__global__ void __launch_bounds__(THREADS, 2) allgather_gemm_fp8(const Args p) {
  __shared__ Smem sm;
  const int pushes = (p.world - 1) * p.tiles_m;
  for (int i = blockIdx.x; i < pushes; i += gridDim.x)
    push_rows(p, (p.rank + 1 + i / p.tiles_m) % p.world, i % p.tiles_m);
  const int per_source = p.tiles_m * p.tiles_n;
  const int items = p.world * per_source;
  for (int i = blockIdx.x; i < items; i += gridDim.x) {
    const int s = (p.rank + i / per_source) % p.world;
    const int t = i % per_source;
    gemm_c_tile(p, s, t / p.tiles_n, t % p.tiles_n, sm);
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: a_shard (m, k) uint8, a_scale (m,) float32, b (k, n) uint8,
  // b_scale (n,) float32, c (world * m, n) float32; row-major, C-contiguous. The uint8
  // buffers hold float8 e4m3 bits (__nv_fp8_e4m3, cuda_fp8.h).
  const uint8_t* a_shard = (const uint8_t*)ctx->buffers[0];  // rows rank*m.. of A
  const float* a_scale = (const float*)ctx->buffers[1];      // their scales
  const uint8_t* b = (const uint8_t*)ctx->buffers[2];        // this rank's own B
  const float* b_scale = (const float*)ctx->buffers[3];      // its column scales
  float* c = (float*)ctx->buffers[4];                        // out: (A*sa) @ (b*sb)
  const int64_t m = (int64_t)(ctx->buffer_bytes[1] / sizeof(float));
  const int64_t n = (int64_t)(ctx->buffer_bytes[3] / sizeof(float));
  const int64_t k = m > 0 ? (int64_t)(ctx->buffer_bytes[0] / (size_t)m) : 0;
  // ctx->peer_buffers[r][i]: rank r's buffer i, mapped here through CUDA IPC
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes on every rank, zeroed once
  // before the first call, IPC-shared, kept across calls (flags, gathered rows and scales)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int world = ctx->world_size, rank = ctx->rank;
  if (world < 1 || world > MAX_RANKS) return 2;
  if (m <= 0 || n <= 0 || k <= 0) return 2;
  const int64_t tiles_m = (m + BM - 1) / BM;
  const int64_t tiles_n = (n + BN - 1) / BN;
  const int64_t scales_at = (m * k + 15) / 16 * 16;
  const int64_t slot = scales_at + (m * (int64_t)sizeof(float) + 15) / 16 * 16;
  const size_t half_bytes = (size_t)world * (size_t)slot;
  if (tiles_m > MAX_BLOCKS || world * tiles_m * tiles_n > INT32_MAX ||
      ctx->workspace_bytes < FLAG_BYTES + 2 * half_bytes)
    return 3;

  // resident blocks: the SM count (under MPS: this process's share) times the occupancy,
  // at most 2 a multiprocessor
  static int resident = 0;
  if (!resident) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, allgather_gemm_fp8, THREADS, 0) !=
            cudaSuccess)
      return 4;
    if (sms < 1 || per_sm < 1) return 4;
    resident = sms * (per_sm < 2 ? per_sm : 2);
  }
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  ++epoch;

  Args p = {};
  p.a = a_shard;
  p.sa = a_scale;
  p.b = b;
  p.sb = b_scale;
  p.c = c;
  p.m = m;
  p.k = k;
  p.n = n;
  p.slot = slot;
  p.scales_at = scales_at;
  p.tiles_m = (int)tiles_m;
  p.tiles_n = (int)tiles_n;
  p.rank = rank;
  p.world = world;
  p.epoch = epoch;
  const size_t half = FLAG_BYTES + (size_t)(epoch & 1) * half_bytes;
  for (int r = 0; r < world; ++r) {
    char* ws = (char*)(r == rank ? ctx->workspace : ctx->peer_workspace[r]);
    p.flags[r] = (uint32_t*)ws;
    p.gather[r] = (uint8_t*)(ws + half);
  }
  const int64_t work = world * tiles_m * tiles_n;
  const int64_t grid = work < resident ? (work > 0 ? work : 1) : resident;
  allgather_gemm_fp8<<<(unsigned)grid, THREADS, 0, stream>>>(p);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
