// Reduce-scatter (sum, float32) over CUDA IPC: every rank reads its own block of every rank's
// sendbuf straight from the peers' memory and writes the sum into its recvbuf, synchronizing
// with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (each rank pulls its own block, as MSCCL++'s reduce-scatter over memory channels):
//   1. start barrier: block b of every rank tells block b of every peer "my call number
//      `epoch` has begun" (so everything its stream did before, writing sendbuf included, is
//      done) and waits for the same word from every peer;
//   2. the reduction: rank r's block starts at element r * count of every sendbuf, with the
//      same alignment in all of them (all are 256-byte aligned). The floats before its first
//      16-byte boundary (head) and after its last (tail) are summed one by one; in between,
//      each thread loads whole 16-byte vectors from every rank's sendbuf (the peers' over
//      NVLink, UNROLL per rank in flight at once), sums them in rank order and stores the sum
//      into recvbuf (whole vectors when recvbuf's matching place is aligned, else floats);
//   3. end barrier: block b waits until block b of every peer has finished reading, so no
//      rank returns (and lets its caller overwrite sendbuf) while a peer still reads it.
// The barriers pair block b with block b only: every rank launches the same grid (from count
// and the SM count, never from this rank's alignment), and the end barriers of all blocks
// together cover every peer block. The grid (at most 2 blocks of 512 threads per SM) is
// co-resident. The flag value is a call counter kept on the host: every rank makes the same
// calls, and it grows every call, so a flag left by an earlier call never passes a barrier.
constexpr int MAX_RANKS = 8;       // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;   // flag slots per barrier
constexpr int THREADS = 512;
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Args {
  const float* src[MAX_RANKS];   // this rank's block in every rank's sendbuf, mapped here
  float* dst;                    // own recvbuf
  Flags* peer_flags[MAX_RANKS];  // every rank's workspace, mapped here
  Flags* own_flags;
  size_t count;
  int rank;
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

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin until the flag holds this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// Block-level barrier with block blockIdx.x of every other rank. The __syncthreads before
// orders every thread's earlier accesses before the release store (cumulativity); the one
// after hands the acquired state to the whole block.
template <int N>
__device__ __forceinline__ void barrier(const Args& a, bool at_end) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < N && peer != a.rank) {
    Flags* theirs = a.peer_flags[peer];
    uint32_t* out = at_end ? &theirs->end[blockIdx.x][a.rank] : &theirs->start[blockIdx.x][a.rank];
    const uint32_t* in = at_end ? &a.own_flags->end[blockIdx.x][peer]
                                : &a.own_flags->start[blockIdx.x][peer];
    st_release_sys(out, a.epoch);
    wait_for(in, a.epoch);
  }
  __syncthreads();
}

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// the sum of vector i (counted from the block's first 16-byte boundary), stored into recvbuf
__device__ __forceinline__ void put4(float* out, bool aligned, size_t i, float4 s) {
  if (aligned) {
    reinterpret_cast<float4*>(out)[i] = s;
  } else {
    float* p = out + 4 * i;
    p[0] = s.x; p[1] = s.y; p[2] = s.z; p[3] = s.w;
  }
}

template <int N, int UNROLL>
__global__ void __launch_bounds__(THREADS, 2) reduce_scatter_kernel(const Args a) {
  barrier<N>(a, false);

  // floats before the block's first 16-byte boundary, whole vectors, floats after the last
  const size_t past = ((uintptr_t)a.src[0] & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > a.count) head = a.count;
  const size_t vecs = (a.count - head) / 4;
  const size_t tail = a.count - head - vecs * 4;
  float* out = a.dst + head;
  const bool aligned = head == 0;  // recvbuf itself is 16-byte aligned
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  // UNROLL vectors per thread and rank in flight: all loads first, then the sums and stores
  for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
    float4 v[N][UNROLL];
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        v[r][u] = reinterpret_cast<const float4*>(a.src[r] + head)[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float4 s = v[0][u];
#pragma unroll
      for (int r = 1; r < N; ++r) s = add4(s, v[r][u]);
      put4(out, aligned, i + u * stride, s);
    }
  }
  for (; i < vecs; i += stride) {
    float4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const float4*>(a.src[r] + head)[i];
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < N; ++r) s = add4(s, v[r]);
    put4(out, aligned, i, s);
  }
  // the head floats, then the tail floats, one thread each
  if (blockIdx.x == 0 && threadIdx.x < head) {
    const size_t t = threadIdx.x;
    float s = a.src[0][t];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][t];
    a.dst[t] = s;
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    float s = a.src[0][t];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][t];
    a.dst[t] = s;
  }

  barrier<N>(a, true);
}

template <int N>
static void launch(const Args& a, int sms, cudaStream_t stream) {
  constexpr int UNROLL = N <= 2 ? 4 : N <= 4 ? 2 : 1;
  // UNROLL vectors per thread while that fits on the GPU at once (co-resident: at most two
  // blocks per SM); from count and the SM count only, so every rank launches the same grid
  size_t blocks = (a.count / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  const size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  reduce_scatter_kernel<N, UNROLL><<<(unsigned)blocks, THREADS, 0, stream>>>(a);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // n blocks of count floats
  float* recvbuf = (float*)ctx->buffers[1];              // the sum of block `rank`: count floats
  const size_t count = ctx->buffer_bytes[1] / sizeof(float);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Flags))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a = {};
  const size_t offset = (size_t)ctx->rank * count;  // this rank's block in every sendbuf
  for (int r = 0; r < n; ++r) {
    const float* base = r == ctx->rank ? sendbuf : (const float*)ctx->peer_buffers[r][0];
    a.src[r] = base + offset;
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.dst = recvbuf;
  a.own_flags = (Flags*)ctx->workspace;
  a.count = count;
  a.rank = ctx->rank;
  a.epoch = ++epoch;

  switch (n) {
    case 1: launch<1>(a, sms, stream); break;
    case 2: launch<2>(a, sms, stream); break;
    case 3: launch<3>(a, sms, stream); break;
    case 4: launch<4>(a, sms, stream); break;
    case 5: launch<5>(a, sms, stream); break;
    case 6: launch<6>(a, sms, stream); break;
    case 7: launch<7>(a, sms, stream); break;
    default: launch<8>(a, sms, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
