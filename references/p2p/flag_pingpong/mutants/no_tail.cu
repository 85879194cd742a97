// GPU-initiated ping-pong between ranks 0 and 1: peer stores over NVLink, flags in CUDA-IPC
// shared workspaces, one kernel per rank and call.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// mutant: only whole 16-byte words are sent: the last bytes % 16 bytes never arrive
// Rank 0 (ping): every block stores its share of sendbuf straight into rank 1's recvbuf, then
// raises its own flag in rank 1's workspace. Rank 1 (pong): every block waits until all ping
// flags are up, stores its share of its sendbuf into rank 0's recvbuf and raises its flag in
// rank 0's workspace; rank 0's block b returns once pong flag b is up. A flag holds the number
// of the call that raised it (the epoch, which only grows), so a flag left over from an earlier
// call never passes for this one. Each thread loads its first words into registers before any
// waiting, so rank 1's reply leaves without a trip to its own memory.
constexpr int THREADS = 512;
constexpr int WPT = 2;                // 16-byte words per thread and step
constexpr int CHUNK = THREADS * WPT;  // words per block and step (16 KiB)
constexpr int MAX_BLOCKS = 64;        // one flag per block in each workspace

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// spins until the flag has reached `epoch` (wrap-around safe)
__device__ __forceinline__ void wait_epoch(const uint32_t* p, uint32_t epoch) {
  while ((int32_t)(load_acquire_sys(p) - epoch) < 0) {
  }
}

__global__ void __launch_bounds__(THREADS)
pingpong(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t words,
         const unsigned char* __restrict__ src_tail, unsigned char* __restrict__ dst_tail,
         int tail, uint32_t* flags, uint32_t* peer_flags, uint32_t epoch, int ping) {
  const int tid = threadIdx.x;
  const size_t stride = (size_t)gridDim.x * CHUNK;
  size_t base = (size_t)blockIdx.x * CHUNK;
  uint4 v[WPT];
#pragma unroll
  for (int u = 0; u < WPT; ++u) {
    const size_t i = base + (size_t)u * THREADS + tid;
    if (i < words) v[u] = src[i];
  }
  const bool tail_thread = blockIdx.x == 0 && tid < tail;  // the last bytes % 16 bytes
  unsigned char t = 0;
  if (tail_thread) t = src_tail[tid];
  if (!ping) {  // rank 1 answers only once the whole ping has landed
    for (int b = tid; b < (int)gridDim.x; b += THREADS) wait_epoch(flags + b, epoch);
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < WPT; ++u) {
    const size_t i = base + (size_t)u * THREADS + tid;
    if (i < words) dst[i] = v[u];
  }
  for (base += stride; base < words; base += stride) {  // messages larger than one step per block
#pragma unroll
    for (int u = 0; u < WPT; ++u) {
      const size_t i = base + (size_t)u * THREADS + tid;
      if (i < words) dst[i] = src[i];
    }
  }
  __syncthreads();  // every store of this block is issued before thread 0 signals ...
  if (tid == 0) {
    __threadfence_system();  // ... and visible to the peer before the flag is
    store_release_sys(peer_flags + blockIdx.x, epoch);
    if (ping) wait_epoch(flags + blockIdx.x, epoch);  // rank 0: until this part of the reply landed
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  if (ctx->rank > 1) return 0;                      // only ranks 0 and 1 take part
  const int peer = 1 - ctx->rank;
  const void* sendbuf = ctx->buffers[0];            // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];        // same size for sendbuf and recvbuf, both ranks
  void* peer_recvbuf = ctx->peer_buffers[peer][1];  // the peer's recvbuf (CUDA IPC)
  void* flags = ctx->workspace;                     // this rank's workspace, zeroed once
  void* peer_flags = ctx->peer_workspace[peer];     // the peer's workspace (CUDA IPC)
  const size_t flag_bytes = ctx->workspace_bytes;   // size of each workspace
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  static uint32_t epoch = 0;  // calls so far: ranks 0 and 1 make the same calls
  if (flag_bytes < MAX_BLOCKS * sizeof(uint32_t)) return 2;
  const size_t words = bytes / 16;
  const int tail = (int)(bytes - words * 16);
  size_t blocks = (words + CHUNK - 1) / CHUNK;  // the same on both ranks (same sizes)
  if (blocks < 1) blocks = 1;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  ++epoch;
  pingpong<<<(unsigned)blocks, THREADS, 0, stream>>>(
      (const uint4*)sendbuf, (uint4*)peer_recvbuf, words,
      (const unsigned char*)sendbuf + words * 16, (unsigned char*)peer_recvbuf + words * 16, tail,
      (uint32_t*)flags, (uint32_t*)peer_flags, epoch, ctx->rank == 0);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
