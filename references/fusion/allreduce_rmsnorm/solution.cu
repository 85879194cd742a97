// All-reduce fused with the residual add and RMSNorm (float32) over CUDA IPC, in one kernel:
// every rank sums the partial results of all ranks, adds the residual, and normalizes every
// row, synchronizing with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (one kernel, one-shot, as the fused all-reduce + RMSNorm of TensorRT-LLM and vLLM
// for small batches): a block owns whole rows. For each of its rows every thread loads its
// 16-byte pieces of the row from every rank's x (one local, the rest through CUDA IPC, all
// in flight at once), adds them in rank order and then the residual, writes residual_out,
// and keeps the sums in registers; a block reduction gives the row's sum of squares, and the
// same registers are scaled into y. No row is read twice and nothing is staged.
//
// Flags, per rank in its workspace (every peer writes only its own slot):
//   start[p]: the last call rank p began. Every block announces its rank's call to every
//     peer as its first action, then waits until every peer has announced the same call
//     here (their x are in place) before it reads any x.
//   done[p]: the last call in which rank p finished reading this rank's x. The last block of
//     a rank to finish (a counter in its own workspace) announces it to every peer, then
//     waits until every peer has announced it here: no rank returns while a peer may still
//     read its x (its caller may overwrite x as soon as the call is over).
// The call number (epoch) is a host counter: every rank makes the same calls, so they agree,
// and it grows every call, so nothing left from an earlier call passes a wait early. No
// block waits for another block of its own grid, so any grid size works on every rank.
constexpr int MAX_RANKS = 8;
constexpr int THREADS = 256;
constexpr int MAX_VPT = 8;  // float4 per thread and row: H up to 4 * 256 * 8 = 8192

struct Flags {
  uint32_t start[COMMBENCH_MAX_RANKS];  // [from rank]
  uint32_t done[COMMBENCH_MAX_RANKS];   // [from rank]
  uint32_t finished;                    // this rank's blocks done with the current call
};

struct Args {
  const float4* x[MAX_RANKS];     // every rank's x, mapped here
  const float4* residual;
  const float4* gamma;
  float4* y;
  float4* residual_out;
  Flags* peer_flags[MAX_RANKS];   // every rank's workspace, mapped here
  Flags* own_flags;
  int tokens;                     // T
  int hidden;                     // H
  int rank;
  float eps;
  uint32_t epoch;
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// the sum of x over the block, the same value in every thread (red: THREADS / 32 floats)
__device__ __forceinline__ float block_sum(float x, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) total += red[w];
  __syncthreads();  // red is free again for the next row
  return total;
}

template <int N, int VPT>
__global__ void __launch_bounds__(THREADS) allreduce_rmsnorm(const Args a) {
  __shared__ float red[THREADS / 32];
  const int peer = threadIdx.x;
  // this rank's call has begun: its x is in place for its peers
  if (peer < N && peer != a.rank) st_release_sys(&a.peer_flags[peer]->start[a.rank], a.epoch);
  // every peer's x may be read once its call has begun
  if (peer < N && peer != a.rank) {
    while (ld_acquire_sys(&a.own_flags->start[peer]) < a.epoch) {
    }
  }
  __syncthreads();

  const int h4 = a.hidden / 4;
  for (int row = blockIdx.x; row < a.tokens; row += gridDim.x) {
    const size_t base = (size_t)row * h4;
    float4 s[VPT];
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int c = threadIdx.x + j * THREADS;
      s[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c < h4) {
        float4 part[N];
#pragma unroll
        for (int r = 0; r < N; ++r) part[r] = a.x[r][base + c];
        float4 acc = part[0];
#pragma unroll
        for (int r = 1; r < N; ++r) acc = add4(acc, part[r]);
        s[j] = add4(acc, a.residual[base + c]);
        a.residual_out[base + c] = s[j];
        sq += s[j].x * s[j].x + s[j].y * s[j].y + s[j].z * s[j].z + s[j].w * s[j].w;
      }
    }
    const float rstd = rsqrtf(block_sum(sq, red) / (float)a.hidden + a.eps);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int c = threadIdx.x + j * THREADS;
      if (c < h4) {
        const float4 g = a.gamma[c];
        a.y[base + c] = make_float4(s[j].x * rstd * g.x, s[j].y * rstd * g.y,
                                    s[j].z * rstd * g.z, s[j].w * rstd * g.w);
      }
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
  if (peer < N && peer != a.rank) {
    st_release_sys(&a.peer_flags[peer]->done[a.rank], a.epoch);
    while (ld_acquire_sys(&a.own_flags->done[peer]) < a.epoch) {
    }
  }
}

template <int N>
static void launch_n(const Args& a, int vpt, unsigned blocks, cudaStream_t stream) {
  switch (vpt) {
    case 1: allreduce_rmsnorm<N, 1><<<blocks, THREADS, 0, stream>>>(a); break;
    case 2: allreduce_rmsnorm<N, 2><<<blocks, THREADS, 0, stream>>>(a); break;
    case 4: allreduce_rmsnorm<N, 4><<<blocks, THREADS, 0, stream>>>(a); break;
    default: allreduce_rmsnorm<N, MAX_VPT><<<blocks, THREADS, 0, stream>>>(a); break;
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];         // (T, H) this rank's partial sums
  const float* residual = (const float*)ctx->buffers[1];  // (T, H) the residual stream
  const float* gamma = (const float*)ctx->buffers[2];     // (H) the RMSNorm weight
  float* y = (float*)ctx->buffers[3];                     // (T, H) output: the normalized rows
  float* residual_out = (float*)ctx->buffers[4];          // (T, H) output: sum + residual
  const int64_t H = ctx->num_params >= 1 ? ctx->params[0] : 0;  // hidden
  const size_t T = H > 0 ? ctx->buffer_bytes[0] / (sizeof(float) * (size_t)H) : 0;
  const float eps = 1e-6f;
  // ctx->peer_buffers[r][0]: rank r's x, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (H < 4 || H % 4 != 0 || H > 4 * THREADS * MAX_VPT) return 3;
  if (T == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  if (T > (size_t)(1 << 30)) return 4;
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 5;

  Args a = {};
  for (int r = 0; r < n; ++r) {
    a.x[r] = (const float4*)ctx->peer_buffers[r][0];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.x[ctx->rank] = (const float4*)x;
  a.residual = (const float4*)residual;
  a.gamma = (const float4*)gamma;
  a.y = (float4*)y;
  a.residual_out = (float4*)residual_out;
  a.own_flags = (Flags*)ctx->workspace;
  a.tokens = (int)T;
  a.hidden = (int)H;
  a.rank = ctx->rank;
  a.eps = eps;
  a.epoch = ++epoch;

  // float4 per thread and row, a power of two: the row's sums stay in registers
  const int need = (int)((H / 4 + THREADS - 1) / THREADS);
  const int vpt = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : MAX_VPT;
  // a block per row while that fits on the GPU a few times over, then rows in turn
  const size_t most = (size_t)sms * 4;
  const unsigned blocks = (unsigned)(T < most ? T : most);
  switch (n) {
    case 1: launch_n<1>(a, vpt, blocks, stream); break;
    case 2: launch_n<2>(a, vpt, blocks, stream); break;
    case 3: launch_n<3>(a, vpt, blocks, stream); break;
    case 4: launch_n<4>(a, vpt, blocks, stream); break;
    case 5: launch_n<5>(a, vpt, blocks, stream); break;
    case 6: launch_n<6>(a, vpt, blocks, stream); break;
    case 7: launch_n<7>(a, vpt, blocks, stream); break;
    default: launch_n<8>(a, vpt, blocks, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
