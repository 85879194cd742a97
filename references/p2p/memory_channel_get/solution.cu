// Memory-channel get around a ring over CUDA IPC: every rank reads the previous rank's message
// straight out of that rank's sendbuf from a kernel, once the owner has signalled that it is
// ready, and tells the owner when it has finished reading.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a memory channel per block, as MSCCL++'s MemoryChannel get with signal/wait):
//   1. block b tells the next rank "my call number `epoch` has begun: my sendbuf holds this
//      call's message" (a release store into that rank's `ready[b]`), and waits (acquire)
//      until the previous rank has said the same before it reads anything of its sendbuf;
//   2. the block's warps copy their share of the previous rank's sendbuf into this rank's
//      recvbuf: 16-byte vectors, 32 consecutive ones per warp instruction, UNROLL remote
//      loads in flight per lane (all loads first, then the local stores); the last block also
//      copies the count % 4 floats past the last whole vector;
//   3. after a __syncthreads (every thread's loads done and ordered before it), one thread
//      tells the previous rank "block b has finished reading your sendbuf" (release store into
//      its `done[b]`) and waits until the next rank has said the same about this rank's
//      sendbuf: no rank ends its call while its reader may still load its sendbuf, which its
//      caller may overwrite as soon as the call is done.
// Each rank writes only its own recvbuf, so its output is complete when its kernel ends.
// Semaphores are counters: the value written is the call number, kept on the host (every rank
// makes the same calls, so the numbers agree), and a waiter wants the current call's number,
// so a semaphore left by an earlier call never lets it through. The end handshake keeps a rank
// within one call of its neighbours, so "at least this call's number" is "exactly". Every
// rank launches the same grid (from count and the SM count only), so block b's semaphores
// pair up; the grid (at most 2 blocks of 512 threads per SM) is co-resident.
constexpr int THREADS = 512;
constexpr int UNROLL = 4;          // 16-byte remote loads in flight per thread
constexpr int MAX_BLOCKS = 1024;   // semaphore slots per direction
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Semaphores {
  uint32_t ready[MAX_BLOCKS];  // set by the previous rank: its sendbuf holds this call's message
  uint32_t done[MAX_BLOCKS];   // set by the next rank: it has read block b's share of my sendbuf
};

struct Args {
  const float* src;      // the previous rank's sendbuf, mapped here
  float* dst;            // own recvbuf
  Semaphores* own;       // this rank's workspace
  Semaphores* prev;      // the previous rank's workspace, mapped here
  Semaphores* next;      // the next rank's workspace, mapped here
  size_t count;
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

// spin until the semaphore holds this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

__global__ void __launch_bounds__(THREADS, 2) get_kernel(const Args a) {
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    st_release_sys(&a.next->ready[b], a.epoch);  // my sendbuf holds this call's message
    wait_for(&a.own->ready[b], a.epoch);         // the previous rank's does too
  }
  __syncthreads();

  const size_t vecs = a.count / 4;
  const float4* src = reinterpret_cast<const float4*>(a.src);
  float4* dst = reinterpret_cast<float4*>(a.dst);
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)b * THREADS + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
    float4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < vecs; i += stride) dst[i] = src[i];
  // the count % 4 floats past the last whole vector
  const size_t tail = a.count - vecs * 4;
  if (b == (int)gridDim.x - 1 && threadIdx.x < tail) {
    const size_t t = vecs * 4 + threadIdx.x;
    a.dst[t] = a.src[t];
  }

  __syncthreads();
  if (threadIdx.x == 0) {
    st_release_sys(&a.prev->done[b], a.epoch);  // finished reading its share of prev's sendbuf
    wait_for(&a.own->done[b], a.epoch);         // my reader has finished with mine
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's message (read by next)
  float* recvbuf = (float*)ctx->buffers[1];              // gets the message of rank (rank-1) % n
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int n = ctx->world_size;
  const int next = (ctx->rank + 1) % n;
  const int prev = (ctx->rank + n - 1) % n;
  const float* prev_sendbuf = (const float*)ctx->peer_buffers[prev][0];  // what this rank reads
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf;
  if (n < 1 || n > COMMBENCH_MAX_RANKS || ctx->workspace == nullptr ||
      ctx->workspace_bytes < sizeof(Semaphores))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a;
  a.src = prev_sendbuf;
  a.dst = recvbuf;
  a.own = (Semaphores*)ctx->workspace;
  a.prev = (Semaphores*)ctx->peer_workspace[prev];
  a.next = (Semaphores*)ctx->peer_workspace[next];
  a.count = count;
  a.epoch = ++epoch;

  // UNROLL vectors per thread while that fits on the GPU at once (co-resident: at most two
  // blocks per SM); from count and the SM count only, so every rank launches the same grid
  const size_t vecs = count / 4;
  size_t blocks = (vecs + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  const size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  get_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
