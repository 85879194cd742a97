// Memory-channel put around a ring over CUDA IPC: every rank stores its message straight into
// the next rank's recvbuf from a kernel and signals a semaphore in that rank's workspace; the
// receiving rank waits on it.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a memory channel per block, as MSCCL++'s MemoryChannel put/signal/wait):
//   1. block b tells the previous rank "my call number `epoch` has begun: block b's share of
//      my recvbuf may be written" (a release store into that rank's `ready[b]`), and waits
//      until the next rank has said the same (acquire) before it writes anything there;
//   2. the block's warps copy their share of sendbuf into the next rank's recvbuf: each warp
//      moves 32 consecutive 16-byte vectors per instruction, UNROLL of them in flight per lane
//      (all loads first, then the remote stores); the last block also copies the count % 4
//      floats past the last whole vector;
//   3. after a __syncthreads (every thread's stores ordered before it), one thread signals
//      the next rank's `data[b]` with a release store, and waits (acquire) until the previous
//      rank has signalled this rank's `data[b]`: when every block has got past its wait, the
//      whole incoming message is in recvbuf, so this rank's recvbuf is complete when its
//      kernel ends, whatever its peers do afterwards.
// Semaphores are counters: the value written is the call number, kept on the host (every rank
// makes the same calls, so the numbers agree). A waiter wants the current call's number, so a
// semaphore left by an earlier call never lets it through. A rank is never more than one call
// ahead of its neighbours on a semaphore (its next push needs the receiver's next `ready`),
// so "at least this call's number" and "exactly" are the same test. Every rank launches the
// same grid (it depends on count and the SM count only), so block b's semaphores pair up;
// the grid (at most 2 blocks of 512 threads per SM) is co-resident, so a spinning block never
// keeps a block of its own grid from running.
constexpr int THREADS = 512;
constexpr int UNROLL = 4;          // 16-byte vectors in flight per thread
constexpr int MAX_BLOCKS = 1024;   // semaphore slots per direction
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Semaphores {
  uint32_t ready[MAX_BLOCKS];  // set by the next rank: its recvbuf may be written (call number)
  uint32_t data[MAX_BLOCKS];   // set by the previous rank: block b's share has landed here
};

struct Args {
  const float* src;      // own sendbuf
  float* dst;            // the next rank's recvbuf, mapped here
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

__global__ void __launch_bounds__(THREADS, 2) put_kernel(const Args a) {
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    st_release_sys(&a.prev->ready[b], a.epoch);  // my recvbuf is this call's
    wait_for(&a.own->ready[b], a.epoch);         // the next rank's is too
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
    st_release_sys(&a.next->data[b], a.epoch);  // block b's share is in the next recvbuf
    wait_for(&a.own->data[b], a.epoch);         // and the previous rank's share in mine
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's message
  float* recvbuf = (float*)ctx->buffers[1];              // gets the message of rank (rank-1) % n
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int n = ctx->world_size;
  const int next = (ctx->rank + 1) % n;
  const int prev = (ctx->rank + n - 1) % n;
  float* next_recvbuf = (float*)ctx->peer_buffers[next][1];  // where this rank's message goes
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)recvbuf;
  if (n < 1 || n > COMMBENCH_MAX_RANKS || ctx->workspace == nullptr ||
      ctx->workspace_bytes < sizeof(Semaphores))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a;
  a.src = sendbuf;
  a.dst = next_recvbuf;
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
  put_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
