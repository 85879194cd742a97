// Two-shot all-reduce (sum, float32) over CUDA IPC: a reduce-scatter (each rank reduces one
// slice of the buffer, reading every rank's sendbuf) followed by an all-gather of the reduced
// slices, synchronized through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: one kernel, two barriers.
//   1. start barrier: block b of every rank tells block b of every peer "my call number
//      `epoch` has begun" (so this rank's sendbuf is ready and its recvbuf may be written)
//      and waits for the same word from every peer;
//   2. reduce-scatter by pulling, all-gather by pushing: the 16-byte vectors are split in n
//      slices of ceil(vectors / n); rank r loads its slice from every rank's sendbuf (its own
//      locally, the others over NVLink; UNROLL vectors per rank all in flight at once), sums
//      them and stores the sum straight into slice r of every rank's recvbuf (its own and,
//      over NVLink, the peers'). The reduced slice never round-trips through memory, so no
//      barrier is needed between the two phases; NVLink carries (n-1)/n of the buffer in
//      each direction for the reads and as much for the writes, as a ring would.
//      The count % 4 elements past the last vector are summed by every rank for itself;
//   3. end barrier: block b waits until block b of every peer has finished (its reads of
//      this rank's sendbuf and its writes into this rank's recvbuf, released by the flag
//      store), so when the kernel ends the result is complete and sendbuf is free again.
// The barriers pair block b with block b only: every rank launches the same grid (it depends
// on the slice length, the same on every rank, and the SM count), and the end barriers of all
// blocks together cover every peer block. The grid (at most 2 blocks per SM, 512 threads) is
// co-resident, so a spinning block never keeps a peer block from being scheduled. The flag
// value is the host-side call counter: every rank makes the same calls and it grows each time,
// so a flag from any earlier call, whatever its grid, never satisfies a later barrier.
constexpr int MAX_RANKS = 8;       // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;   // flag slots per barrier in the workspace
constexpr int THREADS = 512;

struct Flags {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Args {
  const float* src[MAX_RANKS];   // every rank's sendbuf, mapped here
  float* dst[MAX_RANKS];         // every rank's recvbuf, mapped here
  Flags* peer_flags[MAX_RANKS];  // every rank's workspace, mapped here
  Flags* own_flags;
  size_t count;                  // elements
  size_t per;                    // vectors per slice: ceil(count / 4 / n)
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

// Block-level barrier with block blockIdx.x of every other rank. The __syncthreads before
// orders every thread's earlier accesses (peer reads, peer writes) before the release store
// (cumulativity); the one after hands the acquired state to the whole block.
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
    while (ld_acquire_sys(in) != a.epoch) {
    }
  }
  __syncthreads();
}

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

template <int N, int UNROLL>
__global__ void __launch_bounds__(THREADS, 2) twoshot_allreduce(const Args a) {
  barrier<N>(a, false);

  const size_t vecs = a.count / 4;
  const size_t begin = (size_t)a.rank * a.per < vecs ? (size_t)a.rank * a.per : vecs;
  const size_t end = begin + a.per < vecs ? begin + a.per : vecs;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = begin + (size_t)blockIdx.x * THREADS + threadIdx.x;
  // UNROLL vectors per thread and rank in flight: all loads first, then the sums and stores
  for (; i + (UNROLL - 1) * stride < end; i += UNROLL * stride) {
    float4 v[N][UNROLL];
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        v[r][u] = reinterpret_cast<const float4*>(a.src[r])[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float4 s = v[0][u];
#pragma unroll
      for (int r = 1; r < N; ++r) s = add4(s, v[r][u]);
#pragma unroll
      for (int r = 0; r < N; ++r) reinterpret_cast<float4*>(a.dst[r])[i + u * stride] = s;
    }
  }
  for (; i < end; i += stride) {
    float4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const float4*>(a.src[r])[i];
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < N; ++r) s = add4(s, v[r]);
#pragma unroll
    for (int r = 0; r < N; ++r) reinterpret_cast<float4*>(a.dst[r])[i] = s;
  }

  // the last count % 4 elements: every rank sums them for its own recvbuf (in rank order,
  // so all ranks agree bit for bit)
  const size_t tail = a.count - vecs * 4;
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x < tail) {
    const size_t t = vecs * 4 + threadIdx.x;
    float s = a.src[0][t];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][t];
    a.dst[a.rank][t] = s;
  }

  barrier<N>(a, true);
}

template <int N>
static void launch(const Args& a, int sms, cudaStream_t stream) {
  constexpr int UNROLL = N <= 2 ? 4 : N <= 4 ? 2 : 1;
  // enough threads for the slice, at most 2 blocks per SM (co-resident); from `per`, which
  // is the same on every rank, never from this rank's own (possibly shorter) slice
  size_t blocks = (a.per + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  twoshot_allreduce<N, UNROLL><<<(unsigned)blocks, THREADS, 0, stream>>>(a);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];   // this rank's input
  float* recvbuf = (float*)ctx->buffers[1];               // this rank's output
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  // mutant: pushes the reduced slice into the peers' sendbuf (buffer 0) instead of their
  // recvbuf (buffer 1): every slice but a rank's own stays unwritten in its recvbuf
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a = {};
  for (int r = 0; r < n; ++r) {
    a.src[r] = (const float*)ctx->peer_buffers[r][0];
    a.dst[r] = (float*)ctx->peer_buffers[r][0];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.src[ctx->rank] = sendbuf;
  a.dst[ctx->rank] = recvbuf;
  a.own_flags = (Flags*)ctx->workspace;
  a.count = count;
  a.per = (count / 4 + n - 1) / n;
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
