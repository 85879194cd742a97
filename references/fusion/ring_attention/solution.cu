// Ring attention (sequence parallel, non-causal, one head, float32) over CUDA IPC: every rank
// holds a slice of the sequence's queries, keys and values and computes the attention output
// of its queries over the keys and values of ALL ranks, block by block with an online softmax,
// synchronizing with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: one kernel. Block b computes the output of this rank's query rows
// [64 b, 64 b + 64) in flash-attention style: the 64 queries stay in shared memory, and the
// keys and values of every rank stream through it in tiles, read straight from the peers'
// buffers through CUDA IPC, one rank after the other in ring order (rank, rank + 1, ...).
// For every tile the block forms the 64 x BN scores, folds them into a running maximum and
// a running sum per query row (rescaling what it accumulated so far by exp(old max - new
// max) whenever the maximum grows) and accumulates P V; nothing larger than a tile is ever
// materialized. At the end each row is divided by its sum.
//
// Flags, per rank in its workspace (every peer writes only its own slot):
//   start[p]: the last call rank p began. Every block of a rank announces its call to every
//     peer as its first action; before a block reads rank p's k and v it waits until
//     start[p] reaches this call's number (rank p's inputs are in place).
//   done[p]: the last call in which rank p finished reading this rank's k and v. The last
//     block of a rank to finish (a counter in its own workspace) announces it to every peer
//     and waits until every peer has announced it here: no rank returns while a peer may
//     still read its k and v (its caller may overwrite them next).
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
  const float* q;                 // own queries
  const float* k[MAX_RANKS];      // every rank's keys, mapped here
  const float* v[MAX_RANKS];      // every rank's values, mapped here
  float* o;                       // own output
  Flags* peer_flags[MAX_RANKS];   // every rank's workspace, mapped here
  Flags* own_flags;
  int rows;                       // S_local
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

// rows [r0, r0 + N) of a (limit x D) row-major matrix into a tile of row stride `stride`
// (floats); rows at or past `limit` become zeros
template <int D, int N>
__device__ __forceinline__ void load_tile(float* tile, int stride, const float* src, int r0,
                                          int limit) {
  constexpr int V4 = D / 4;
  for (int i = threadIdx.x; i < N * V4; i += THREADS) {
    const int r = i / V4;
    const int c = (i % V4) * 4;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r0 + r < limit) val = *reinterpret_cast<const float4*>(src + (size_t)(r0 + r) * D + c);
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
__global__ void __launch_bounds__(THREADS, 2) ring_attention(const Args a) {
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

  // this rank's call has begun: its k and v are in place for its peers
  if (threadIdx.x < a.world && threadIdx.x != a.rank)
    st_release_sys(&a.peer_flags[threadIdx.x]->start[a.rank], a.epoch);

  load_tile<D, BM>(sQ, T::QS, a.q, q0, a.rows);

  float m[4], l[4], acc[4][4 * NG];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) acc[i][c] = 0.f;
  }

  for (int step = 0; step < a.world; ++step) {
    const int src = (a.rank + step) % a.world;
    // rank src's keys and values may be read once its call has begun
    if (src != a.rank && threadIdx.x == 0) {
      while (ld_acquire_sys(&a.own_flags->start[src]) < a.epoch) {
      }
    }
    const float* K = a.k[src];
    const float* V = a.v[src];
    for (int k0 = 0; k0 < a.rows; k0 += BN) {
      __syncthreads();  // the wait is over, Q is in place, the last tile is no longer read
      load_tile<D, BN>(sK, T::QS, K, k0, a.rows);
      load_tile<D, BN>(sV, D, V, k0, a.rows);
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
          const bool key = k0 + tx + 16 * j < a.rows;  // keys past the last are masked out
          s[i][j] = key ? s[i][j] * a.scale : -INFINITY;
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

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = q0 + ty * 4 + i;
    if (row < a.rows) {
      const float inv = 1.f / l[i];
#pragma unroll
      for (int g = 0; g < NG; ++g)
        *reinterpret_cast<float4*>(a.o + (size_t)row * D + g * 64 + tx * 4) =
            make_float4(acc[i][g * 4 + 0] * inv, acc[i][g * 4 + 1] * inv,
                        acc[i][g * 4 + 2] * inv, acc[i][g * 4 + 3] * inv);
    }
  }

  // end of the call: the last block of this rank to get here tells every peer that this
  // rank has read all it needed of theirs, then waits until every peer says the same
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(&a.own_flags->finished, 1u) == gridDim.x - 1;
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
static cudaError_t launch(const Args& a, unsigned blocks, cudaStream_t stream) {
  constexpr size_t bytes = Tiles<D, BN>::BYTES;
  static bool opted_in = false;  // more than 48 KiB of dynamic shared memory: asked once
  if (!opted_in) {
    cudaError_t err = cudaFuncSetAttribute(ring_attention<D, BN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) return err;
    opted_in = true;
  }
  ring_attention<D, BN><<<blocks, THREADS, bytes, stream>>>(a);
  return cudaGetLastError();
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* q = (const float*)ctx->buffers[0];  // (S_local, D) this rank's queries
  const float* k = (const float*)ctx->buffers[1];  // (S_local, D) this rank's keys
  const float* v = (const float*)ctx->buffers[2];  // (S_local, D) this rank's values
  float* o = (float*)ctx->buffers[3];              // (S_local, D) this rank's output
  const int64_t D = ctx->num_params >= 1 ? ctx->params[0] : 0;  // head_dim
  const size_t S_local = D > 0 ? ctx->buffer_bytes[0] / (sizeof(float) * (size_t)D) : 0;
  // ctx->peer_buffers[r][1] / [r][2]: rank r's k / v, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (D != 64 && D != 128) return 3;
  if (S_local == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  if (S_local > (size_t)(1 << 30)) return 4;
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls

  Args a = {};
  a.q = q;
  for (int r = 0; r < n; ++r) {
    a.k[r] = (const float*)ctx->peer_buffers[r][1];
    a.v[r] = (const float*)ctx->peer_buffers[r][2];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.k[ctx->rank] = k;
  a.v[ctx->rank] = v;
  a.o = o;
  a.own_flags = (Flags*)ctx->workspace;
  a.rows = (int)S_local;
  a.rank = ctx->rank;
  a.world = n;
  a.epoch = ++epoch;
  a.scale = (float)(1.0 / sqrt((double)D));

  const unsigned blocks = (unsigned)((S_local + BM - 1) / BM);
  const cudaError_t err = D == 64 ? launch<64, 64>(a, blocks, stream)
                                  : launch<128, 32>(a, blocks, stream);
  return err == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
