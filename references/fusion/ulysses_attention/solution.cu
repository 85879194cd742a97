// Ulysses (DeepSpeed-Ulysses) sequence-parallel attention, float32, over CUDA IPC: the
// queries, keys and values arrive sequence-sharded with all heads; attention runs per head
// over the whole sequence with the heads split across the ranks (an all-to-all to the
// head-sharded layout and one back), synchronizing through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: both all-to-alls are fused into one attention kernel. Rank r owns heads
// [r H/n, (r+1) H/n). Block (b, p, jl) computes head j = r H/n + jl for the query rows
// [64 b, 64 b + 64) of rank p: it reads those queries straight from rank p's q (the first
// all-to-all, as loads through CUDA IPC), streams head j's keys and values of every rank
// through shared memory in tiles (rank p's first, then p + 1, ...), folds every tile into the
// result with an online softmax (a running maximum and sum per query row, the accumulator
// rescaled whenever the maximum grows), and writes the finished rows into rank p's o (the
// all-to-all back, as stores through CUDA IPC). Nothing larger than a tile is materialized.
//
// Flags, per rank in its workspace (every peer writes only its own slot):
//   start[p]: the last call rank p began. Every block of a rank announces its call to every
//     peer as its first action; before a block reads rank p's inputs or writes its o, it
//     waits until start[p] reaches this call's number (p's inputs are in place and p's o has
//     been reset by its caller, so nothing written there is lost).
//   done[p]: the last call in which rank p finished with this rank (read its q, k, v and
//     wrote its share of its o). The last block of a rank to finish (a counter in its own
//     workspace) announces it to every peer, then waits until every peer has announced it
//     here: when a rank's call ends, its o is complete and nobody reads its inputs any more.
// The call number (epoch) is a host counter: every rank makes the same calls, so they agree,
// and it grows every call, so nothing left from an earlier call passes a wait early. No
// block waits for another block of its own grid, so the grid may be larger than the GPU.
constexpr int MAX_RANKS = 8;
constexpr int THREADS = 256;  // 16 x 16: thread (ty, tx) owns query rows 4 ty .. 4 ty + 3
constexpr int BM = 64;        // query rows per block

struct Flags {
  uint32_t start[COMMBENCH_MAX_RANKS];  // [from rank]
  uint32_t done[COMMBENCH_MAX_RANKS];   // [from rank]
  uint32_t finished;                    // this rank's blocks done with the current call
};

struct Args {
  const float* q[MAX_RANKS];      // every rank's q, k, v and o, mapped here
  const float* k[MAX_RANKS];
  const float* v[MAX_RANKS];
  float* o[MAX_RANKS];
  Flags* peer_flags[MAX_RANKS];   // every rank's workspace, mapped here
  Flags* own_flags;
  int rows;                       // S_local
  int heads;                      // H
  int heads_per_rank;             // H / n
  int rank;
  int world;
  uint32_t epoch;
  float scale;                    // 1 / sqrt(D)
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// thread 0 waits until rank p's call has begun; the __syncthreads after it (at the next
// tile) hands that on to the whole block
__device__ __forceinline__ void wait_started(const Args& a, int p) {
  if (p != a.rank && threadIdx.x == 0) {
    while (ld_acquire_sys(&a.own_flags->start[p]) < a.epoch) {
    }
  }
}

// shared memory of one block: Q (BM x D), K (BN x D) with rows padded by 4 floats (the
// column-wise reads of a warp then fall in distinct banks), V (BN x D), P (BM x BN, padded)
template <int D, int BN>
struct Tiles {
  static constexpr int QS = D + 4;
  static constexpr int PS = BN + 4;
  static constexpr int K_OFF = BM * QS;
  static constexpr int V_OFF = K_OFF + BN * QS;
  static constexpr int P_OFF = V_OFF + BN * D;
  static constexpr size_t BYTES = (size_t)(P_OFF + BM * PS) * sizeof(float);
};

// rows [r0, r0 + N) of one head (D floats per row, `pitch` floats from one row to the next)
// into a tile of row stride `stride` (floats); rows at or past `limit` become zeros
template <int D, int N>
__device__ __forceinline__ void load_tile(float* tile, int stride, const float* src,
                                          size_t pitch, int r0, int limit) {
  constexpr int V4 = D / 4;
  for (int i = threadIdx.x; i < N * V4; i += THREADS) {
    const int r = i / V4;
    const int c = (i % V4) * 4;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r0 + r < limit) val = *reinterpret_cast<const float4*>(src + (size_t)(r0 + r) * pitch + c);
    *reinterpret_cast<float4*>(tile + r * stride + c) = val;
  }
}

__device__ __forceinline__ float lane_of(const float4& x, int u) {
  return u == 0 ? x.x : u == 1 ? x.y : u == 2 ? x.z : x.w;
}

// max / sum over the 16 threads of a half-warp (the threads that share query rows)
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <int D, int BN>
__global__ void __launch_bounds__(THREADS, 2) ulysses_attention(const Args a) {
  using T = Tiles<D, BN>;
  constexpr int NJ = BN / 16;  // score columns per thread: tx + 16 j
  constexpr int NG = D / 64;   // output column groups per thread: 64 g + 4 tx .. + 3
  extern __shared__ float4 smem4[];
  float* sQ = reinterpret_cast<float*>(smem4);
  float* sK = sQ + T::K_OFF;
  float* sV = sQ + T::V_OFF;
  float* sP = sQ + T::P_OFF;
  const int tx = threadIdx.x & 15;
  const int ty = threadIdx.x >> 4;
  const int q0 = blockIdx.x * BM;
  const int qrank = blockIdx.y;                                // whose query rows
  const int head = a.rank * a.heads_per_rank + blockIdx.z;     // which head (of H)
  const size_t pitch = (size_t)a.heads * D;                    // floats from row to row

  // this rank's call has begun: its inputs are in place and its o may be written
  if (threadIdx.x < a.world && threadIdx.x != a.rank)
    st_release_sys(&a.peer_flags[threadIdx.x]->start[a.rank], a.epoch);

  wait_started(a, qrank);
  __syncthreads();
  load_tile<D, BM>(sQ, T::QS, a.q[qrank] + (size_t)head * D, pitch, q0, a.rows);

  float m[4], l[4], acc[4][4 * NG];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) acc[i][c] = 0.f;
  }

  for (int step = 0; step < a.world; ++step) {
    const int src = (qrank + step) % a.world;
    wait_started(a, src);
    const float* K = a.k[src] + (size_t)head * D;
    const float* V = a.v[src] + (size_t)head * D;
    for (int k0 = 0; k0 < a.rows; k0 += BN) {
      __syncthreads();  // the wait is over, Q is in place, the last tile is no longer read
      load_tile<D, BN>(sK, T::QS, K, pitch, k0, a.rows);
      load_tile<D, BN>(sV, D, V, pitch, k0, a.rows);
      __syncthreads();

      float s[4][NJ];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) s[i][j] = 0.f;
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        float4 qv[4], kv[NJ];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qv[i] = *reinterpret_cast<const float4*>(sQ + (ty * 4 + i) * T::QS + d);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          kv[j] = *reinterpret_cast<const float4*>(sK + (tx + 16 * j) * T::QS + d);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
          }
      }

      // online softmax: every row's running maximum and sum, the accumulator rescaled
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          s[i][j] *= a.scale;
          if (k0 + tx + 16 * j >= a.rows) s[i][j] = -INFINITY;  // past the last key
          mx = fmaxf(mx, s[i][j]);
        }
        // finite: the tile's first key is a real one
        const float m_new = fmaxf(m[i], row_max(mx));
        const float alpha = expf(m[i] - m_new);  // 0 on the first tile (m = -inf)
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const float p = expf(s[i][j] - m_new);
          sum += p;
          sP[(ty * 4 + i) * T::PS + tx + 16 * j] = p;
        }
        l[i] = l[i] * alpha + row_sum(sum);
        m[i] = m_new;
#pragma unroll
        for (int c = 0; c < 4 * NG; ++c) acc[i][c] *= alpha;
      }
      __syncthreads();

      // acc += P V
#pragma unroll 2
      for (int kk = 0; kk < BN; kk += 4) {
        float4 p4[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          p4[i] = *reinterpret_cast<const float4*>(sP + (ty * 4 + i) * T::PS + kk);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float4 vv = *reinterpret_cast<const float4*>(sV + (kk + u) * D + g * 64 + tx * 4);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float p = lane_of(p4[i], u);
              acc[i][g * 4 + 0] = fmaf(p, vv.x, acc[i][g * 4 + 0]);
              acc[i][g * 4 + 1] = fmaf(p, vv.y, acc[i][g * 4 + 1]);
              acc[i][g * 4 + 2] = fmaf(p, vv.z, acc[i][g * 4 + 2]);
              acc[i][g * 4 + 3] = fmaf(p, vv.w, acc[i][g * 4 + 3]);
            }
          }
        }
      }
    }
  }

  // the finished rows go back to the rank that owns them
  float* out = a.o[qrank] + (size_t)head * D;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = q0 + ty * 4 + i;
    if (row < a.rows) {
      const float inv = 1.f / l[i];
#pragma unroll
      for (int g = 0; g < NG; ++g)
        *reinterpret_cast<float4*>(out + (size_t)row * pitch + g * 64 + tx * 4) =
            make_float4(acc[i][g * 4 + 0] * inv, acc[i][g * 4 + 1] * inv,
                        acc[i][g * 4 + 2] * inv, acc[i][g * 4 + 3] * inv);
    }
  }

  // end of the call: the last block of this rank to get here tells every peer that this
  // rank is done with it (its inputs read, its o written), then waits until every peer
  // says the same (the fences make this block's and the counted blocks' stores into the
  // peers' o visible before the flag)
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(&a.own_flags->finished, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x == 0) a.own_flags->finished = 0;  // for the next call: every block counted
  __threadfence_system();
  const int peer = threadIdx.x;
  if (peer < a.world && peer != a.rank) {
    st_release_sys(&a.peer_flags[peer]->done[a.rank], a.epoch);
    while (ld_acquire_sys(&a.own_flags->done[peer]) < a.epoch) {
    }
  }
}

template <int D, int BN>
static cudaError_t launch(const Args& a, dim3 grid, cudaStream_t stream) {
  constexpr size_t bytes = Tiles<D, BN>::BYTES;
  static bool opted_in = false;  // more than 48 KiB of dynamic shared memory: asked once
  if (!opted_in) {
    cudaError_t err = cudaFuncSetAttribute(ulysses_attention<D, BN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) return err;
    opted_in = true;
  }
  ulysses_attention<D, BN><<<grid, THREADS, bytes, stream>>>(a);
  return cudaGetLastError();
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* q = (const float*)ctx->buffers[0];  // (S_local, H, D) this rank's queries
  const float* k = (const float*)ctx->buffers[1];  // (S_local, H, D) this rank's keys
  const float* v = (const float*)ctx->buffers[2];  // (S_local, H, D) this rank's values
  float* o = (float*)ctx->buffers[3];              // (S_local, H, D) this rank's output
  const int64_t H = ctx->num_params >= 2 ? ctx->params[0] : 0;  // heads
  const int64_t D = ctx->num_params >= 2 ? ctx->params[1] : 0;  // head_dim
  const size_t S_local =
      H > 0 && D > 0 ? ctx->buffer_bytes[0] / (sizeof(float) * (size_t)H * (size_t)D) : 0;
  // ctx->peer_buffers[r][i]: rank r's buffer i (q, k, v, o), mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (D != 64 && D != 128) return 3;
  if (H < n || H % n != 0 || H > 4096) return 4;
  if (S_local == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  if (S_local > (size_t)(1 << 30)) return 5;
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls

  Args a = {};
  for (int r = 0; r < n; ++r) {
    a.q[r] = (const float*)ctx->peer_buffers[r][0];
    a.k[r] = (const float*)ctx->peer_buffers[r][1];
    a.v[r] = (const float*)ctx->peer_buffers[r][2];
    a.o[r] = (float*)ctx->peer_buffers[r][3];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.q[ctx->rank] = q;
  a.k[ctx->rank] = k;
  a.v[ctx->rank] = v;
  a.o[ctx->rank] = o;
  a.own_flags = (Flags*)ctx->workspace;
  a.rows = (int)S_local;
  a.heads = (int)H;
  a.heads_per_rank = (int)(H / n);
  a.rank = ctx->rank;
  a.world = n;
  a.epoch = ++epoch;
  a.scale = (float)(1.0 / sqrt((double)D));

  // one block per (64 query rows, the rank that owns them, one of this rank's heads)
  const dim3 grid((unsigned)((S_local + BM - 1) / BM), (unsigned)n, (unsigned)(H / n));
  const cudaError_t err = D == 64 ? launch<64, 64>(a, grid, stream)
                                  : launch<128, 32>(a, grid, stream);
  return err == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
