// All-to-all over CUDA IPC: every rank stores each of its blocks straight into the recvbuf of
// the rank it is meant for, with a ready and a data flag per pair of ranks in an IPC-shared
// workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a memory channel per pair of ranks and per block, as MSCCL++'s all-to-all):
//   1. block b tells every peer "my call number `epoch` has begun: block b's share of my
//      recvbuf may be written" (a release store into the peer's ready[b][rank]), then copies
//      its share of this rank's own block locally;
//   2. for every peer j in turn, starting with the next rank (so the ranks spread their
//      traffic over the peers instead of all writing to rank 0 first): wait (acquire) until j
//      has said its call began, store the block's share of sendbuf block j into block `rank`
//      of j's recvbuf, and after a __syncthreads signal j's data[b][rank] with a release
//      store; a late peer holds up only the pushes to it;
//   3. wait until every peer has signalled data[b][peer]: when every block has got past this,
//      every peer's block is in recvbuf, so this rank's output is complete when its kernel
//      ends, whatever its peers do afterwards.
// The copies store whole 16-byte vectors from the destination's first 16-byte boundary on
// (blocks start at i * count, which need not be aligned): the floats before it and after the
// last vector go one by one, and the source is loaded in whole vectors when it is aligned
// there too, float by float otherwise. Flags pair block b with block b: every rank launches
// the same grid (from count and the SM count), and the waits of all blocks together cover
// every peer block. The grid (at most 2 blocks of 512 threads per SM) is co-resident. The
// flag value is a call counter kept on the host: every rank makes the same calls, and it
// grows every call, so a flag left by an earlier call never lets a wait through (a peer is
// never a call ahead on a flag: its next push needs this rank's next ready).
constexpr int MAX_BLOCKS = 1024;   // flag slots per direction and peer
constexpr int THREADS = 512;
constexpr int UNROLL = 4;          // 16-byte vectors in flight per thread
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t ready[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]: its call has begun
  uint32_t data[MAX_BLOCKS][COMMBENCH_MAX_RANKS];   // [block][from rank]: its share is here
};

struct Args {
  const float* src;                       // own sendbuf
  float* dst[COMMBENCH_MAX_RANKS];        // every rank's recvbuf, mapped here
  Flags* peer_flags[COMMBENCH_MAX_RANKS]; // every rank's workspace, mapped here
  Flags* own_flags;
  size_t count;                           // floats per block
  int rank;
  int n;
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

// this block's share of copying `count` floats from src to dst
__device__ __forceinline__ void copy_share(float* dst, const float* src, size_t count) {
  const size_t past = ((uintptr_t)dst & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > count) head = count;
  const size_t vecs = (count - head) / 4;
  const size_t tail = count - head - vecs * 4;
  float4* d = reinterpret_cast<float4*>(dst + head);
  const float* s = src + head;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  if (((uintptr_t)s & 15) == 0) {
    const float4* sv = reinterpret_cast<const float4*>(s);
    for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = sv[i + u * stride];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) d[i + u * stride] = v[u];
    }
    for (; i < vecs; i += stride) d[i] = sv[i];
  } else {  // the source is off by 4, 8 or 12 bytes: four loads per vector (local, cheap)
    for (; i < vecs; i += stride) {
      const float* p = s + 4 * i;
      d[i] = make_float4(p[0], p[1], p[2], p[3]);
    }
  }
  // the head and tail floats, one thread each
  if (blockIdx.x == 0 && threadIdx.x < head) dst[threadIdx.x] = src[threadIdx.x];
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    dst[t] = src[t];
  }
}

__global__ void __launch_bounds__(THREADS, 2) alltoall_kernel(const Args a) {
  const int b = blockIdx.x;
  const int me = a.rank;
  if ((int)threadIdx.x < a.n && (int)threadIdx.x != me)
    st_release_sys(&a.peer_flags[threadIdx.x]->ready[b][me], a.epoch);  // my recvbuf is this call's
  copy_share(a.dst[me] + (size_t)me * a.count, a.src + (size_t)me * a.count, a.count);

  for (int k = 1; k < a.n; ++k) {
    const int j = (me + k) % a.n;
    if (threadIdx.x == 0) wait_for(&a.own_flags->ready[b][j], a.epoch);  // j's recvbuf is too
    __syncthreads();
    copy_share(a.dst[j] + (size_t)me * a.count, a.src + (size_t)j * a.count, a.count);
    __syncthreads();
    if (threadIdx.x == 0) st_release_sys(&a.peer_flags[j]->data[b][me], a.epoch);
  }

  if ((int)threadIdx.x < a.n && (int)threadIdx.x != me)
    wait_for(&a.own_flags->data[b][threadIdx.x], a.epoch);  // peer's share is in my recvbuf
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // n blocks of count floats, block j for rank j
  float* recvbuf = (float*)ctx->buffers[1];              // n blocks of count floats, block i from rank i
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / (size_t)ctx->world_size;
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > COMMBENCH_MAX_RANKS || n > THREADS || ctx->workspace == nullptr ||
      ctx->workspace_bytes < sizeof(Flags))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a = {};
  a.src = sendbuf;
  for (int r = 0; r < n; ++r) {
    a.dst[r] = (float*)ctx->peer_buffers[r][1];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.dst[ctx->rank] = recvbuf;
  a.own_flags = (Flags*)ctx->workspace;
  a.count = count;
  a.rank = ctx->rank;
  a.n = n;
  a.epoch = ++epoch;

  // UNROLL vectors of a block per thread while that fits on the GPU at once (co-resident: at
  // most two blocks per SM); from count and the SM count only, so every rank launches the
  // same grid
  size_t blocks = (count / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  const size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  alltoall_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
