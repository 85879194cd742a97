// GPU-initiated ping-pong between ranks 0 and 1 over xGMI: stores into the peer's memory,
// flags in the HIP-IPC shared (fine-grained) workspaces, one kernel per rank and call.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// The message is cut into SLICE-word slices, one per block (a block takes every gridDim-th
// slice where there are more slices than blocks). Block b of each rank owns word b of the
// peer's workspace as its flag there. Rank 0 (ping): block b stores its slices of sendbuf into
// rank 1's recvbuf, raises its flag in rank 1's workspace, then polls flag b of its own
// workspace for the matching part of the reply. Rank 1 (pong): every block first polls all of
// the ping's flags (the whole ping must have landed before any of the reply leaves), then
// stores its slices and raises its flag in rank 0's workspace. A flag holds the number of the
// call that raised it (the epoch, which only grows), so a flag left over from an earlier call
// never passes for this one. Each lane loads its first words of sendbuf into registers before
// any polling, so the reply leaves the moment the ping's flags are seen.
//
// Ordering: the data goes to the peer's recvbuf (coarse-grained memory) and the flag to its
// fine-grained workspace. After the block barrier every wavefront's stores have been issued;
// __threadfence_system() then makes them visible across xGMI before the release store (at
// system scope) of the flag, and the poller's acquire load at system scope keeps its work
// after the flag.
constexpr int BLOCK = 256;                // four wavefronts of 64 lanes (eight warps elsewhere)
constexpr int PER_LANE = 2;               // 16-byte words per lane and slice
constexpr int SLICE = BLOCK * PER_LANE;   // words per slice: 8 KiB
constexpr int MAX_BLOCKS = 64;            // flags per workspace (and at most BLOCK)

struct Leg {
  const uint4* src;          // this rank's sendbuf, whole 16-byte words
  uint4* dst;                // the peer's recvbuf
  size_t words;
  const unsigned char* src_tail;  // the last bytes % 16 bytes
  unsigned char* dst_tail;
  int tail;
  uint32_t* inbox;           // this rank's workspace: the peer's flags
  uint32_t* outbox;          // the peer's workspace: this rank's flags
  uint32_t epoch;
  int ping;                  // rank 0
};

__device__ __forceinline__ void await_epoch(uint32_t* flag, uint32_t epoch) {
  while ((int32_t)(__hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM) - epoch) < 0)
    __builtin_amdgcn_s_sleep(1);
}

__global__ void __launch_bounds__(BLOCK) pingpong_leg(Leg g) {
  const int lane = threadIdx.x;
  const size_t stride = (size_t)gridDim.x * SLICE;
  size_t base = (size_t)blockIdx.x * SLICE;
  uint4 first[PER_LANE];
#pragma unroll
  for (int k = 0; k < PER_LANE; ++k) {
    const size_t i = base + (size_t)k * BLOCK + lane;
    if (i < g.words) first[k] = g.src[i];
  }
  const bool tail_lane = blockIdx.x == 0 && lane < g.tail;
  const unsigned char last = tail_lane ? g.src_tail[lane] : 0;

  if (!g.ping) {  // pong: not a byte of the reply before the whole ping has landed
    for (int b = lane; b < (int)gridDim.x; b += BLOCK) await_epoch(g.inbox + b, g.epoch);
    __syncthreads();
  }

#pragma unroll
  for (int k = 0; k < PER_LANE; ++k) {
    const size_t i = base + (size_t)k * BLOCK + lane;
    if (i < g.words) g.dst[i] = first[k];
  }
  for (base += stride; base < g.words; base += stride) {  // more slices than blocks
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
      const size_t i = base + (size_t)k * BLOCK + lane;
      if (i < g.words) g.dst[i] = g.src[i];
    }
  }
  if (tail_lane) g.dst_tail[lane] = last;

  __syncthreads();  // every store of the block issued before lane 0 signals
  if (lane == 0) {
    __threadfence_system();
    __hip_atomic_store(g.outbox + blockIdx.x, g.epoch, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
    if (g.ping) await_epoch(g.inbox + blockIdx.x, g.epoch);  // until this block's reply is in
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  if (ctx->rank > 1) return 0;                      // only ranks 0 and 1 take part
  const int peer = 1 - ctx->rank;
  const void* sendbuf = ctx->buffers[0];            // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];        // same size for sendbuf and recvbuf, both ranks
  void* peer_recvbuf = ctx->peer_buffers[peer][1];  // the peer's recvbuf (HIP IPC)
  void* flags = ctx->workspace;                     // this rank's workspace, zeroed once
  void* peer_flags = ctx->peer_workspace[peer];     // the peer's workspace (HIP IPC)
  const size_t flag_bytes = ctx->workspace_bytes;   // size of each workspace
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  static uint32_t calls = 0;  // calls so far: ranks 0 and 1 make the same calls
  if (flag_bytes < MAX_BLOCKS * sizeof(uint32_t)) return 2;
  Leg g;
  g.words = bytes / 16;
  g.tail = (int)(bytes % 16);
  g.src = (const uint4*)sendbuf;
  g.dst = (uint4*)peer_recvbuf;
  g.src_tail = (const unsigned char*)sendbuf + g.words * 16;
  g.dst_tail = (unsigned char*)peer_recvbuf + g.words * 16;
  g.inbox = (uint32_t*)flags;
  g.outbox = (uint32_t*)peer_flags;
  g.epoch = ++calls;
  g.ping = ctx->rank == 0;
  // one block per slice, up to MAX_BLOCKS: the same grid on both ranks (same sizes)
  size_t blocks = (g.words + SLICE - 1) / SLICE;
  if (blocks < 1) blocks = 1;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  hipLaunchKernelGGL(pingpong_leg, dim3((unsigned)blocks), dim3(BLOCK), 0, stream, g);
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
