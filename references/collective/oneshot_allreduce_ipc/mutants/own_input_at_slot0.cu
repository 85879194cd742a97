// One-shot all-reduce (sum, float32) over CUDA IPC: every rank reads every rank's sendbuf
// and writes the whole sum into its own recvbuf, synchronizing with its peers through flags
// in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (as vLLM's/SGLang's custom all-reduce, one stage):
//   1. start barrier: block b of every rank tells block b of every peer "my call number
//      `epoch` has begun" (so everything this rank's stream did before, writing sendbuf
//      included, is done) and waits for the same word from every peer;
//   2. each thread loads one 16-byte vector from every rank's sendbuf (one local, the rest
//      over NVLink, all in flight at once), sums them in rank order (bitwise the same result
//      on every rank) and stores the sum into its own recvbuf;
//   3. end barrier: block b waits until block b of every peer has finished reading, so no
//      rank returns (and lets its caller overwrite sendbuf) while a peer still reads it.
// The barriers are per block: block b only needs its peers' block b, since a peer's block
// that arrived proves the peer's kernel is running, and the end barrier of every block
// together covers every peer block. Every rank launches the same grid (it depends on count
// and the SM count only), so the blocks pair up. The flag value is a call counter kept on
// the host: all ranks make the same calls, so it agrees, and it grows every call, so a flag
// left over from an earlier call (any size) never passes a barrier early.
constexpr int MAX_RANKS = 8;       // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;   // flag slots per barrier in the workspace
constexpr int THREADS = 256;

struct Flags {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Args {
  const float* src[MAX_RANKS];  // every rank's sendbuf, mapped here
  float* dst;                   // own recvbuf
  Flags* peer_flags[MAX_RANKS]; // every rank's workspace, mapped here
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

// Block-level barrier with block blockIdx.x of every other rank. The __syncthreads before
// orders this block's earlier memory accesses before the release store; the one after makes
// the acquired peer state visible to the whole block.
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

template <int N>
__global__ void __launch_bounds__(THREADS) oneshot_allreduce(const Args a) {
  barrier<N>(a, false);
  const size_t vecs = a.count / 4;
  const size_t stride = (size_t)gridDim.x * THREADS;
  for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < vecs; i += stride) {
    float4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const float4*>(a.src[r])[i];
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < N; ++r) s = add4(s, v[r]);
    reinterpret_cast<float4*>(a.dst)[i] = s;
  }
  // the last count % 4 elements, one thread each
  const size_t tail = a.count - vecs * 4;
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x < tail) {
    const size_t i = vecs * 4 + threadIdx.x;
    float s = a.src[0][i];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][i];
    a.dst[i] = s;
  }
  barrier<N>(a, true);
}

template <int N>
static void launch(const Args& a, unsigned blocks, cudaStream_t stream) {
  oneshot_allreduce<N><<<blocks, THREADS, 0, stream>>>(a);
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
  // mutant: puts its own sendbuf in slot 0 (as if it were rank 0) instead of slot rank:
  // right on rank 0, but every other rank adds its own input twice and never reads rank 0's
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
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.src[0] = sendbuf;
  a.dst = recvbuf;
  a.own_flags = (Flags*)ctx->workspace;
  a.count = count;
  a.rank = ctx->rank;
  a.epoch = ++epoch;

  // one vector per thread while that fits on the GPU at once; the grid depends on count and
  // the SM count only, so it is the same on every rank
  const size_t vecs = count / 4;
  size_t blocks = (vecs + THREADS - 1) / THREADS;
  size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  switch (n) {
    case 1: launch<1>(a, (unsigned)blocks, stream); break;
    case 2: launch<2>(a, (unsigned)blocks, stream); break;
    case 3: launch<3>(a, (unsigned)blocks, stream); break;
    case 4: launch<4>(a, (unsigned)blocks, stream); break;
    case 5: launch<5>(a, (unsigned)blocks, stream); break;
    case 6: launch<6>(a, (unsigned)blocks, stream); break;
    case 7: launch<7>(a, (unsigned)blocks, stream); break;
    default: launch<8>(a, (unsigned)blocks, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
