// An iterated ring exchange inside one kernel: in every step each rank stores its state into
// its right neighbour's mailbox, signals it, waits for its left neighbour's signal and folds
// the received state into its own.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design: one block per rank runs all the steps, its state in registers (PER_THREAD words a
// thread). Steps are numbered over the whole run (g = steps of earlier calls + k): the
// signal `sig` a rank writes into its right neighbour's mailbox is the last step whose
// message it has stored there, and it only ever grows, so no value of an earlier call or
// step passes a wait for step g. Messages go to slot g % DEPTH of the receiver's mailbox. A
// rank can run several steps ahead of its right neighbour (up to n - 1 in a ring of n: it
// only waits for its left neighbour, whose progress in turn depends on the ranks further
// left), so before it overwrites a slot it waits for the receiver's acknowledgement `ack`
// (the last step whose message the receiver has read), written back into its own mailbox.
// Step k on rank r, element by element: s = 2 s + (the state the left neighbour had before
// step k), mod 2^32.
constexpr int THREADS = 1024;
constexpr int PER_THREAD = 16;
constexpr size_t MAX_COUNT = (size_t)THREADS * PER_THREAD;  // 16384
constexpr int DEPTH = 2;                                     // message slots per mailbox

struct Mailbox {
  uint64_t sig;                     // from the left neighbour: its last stored step
  uint64_t pad0[15];
  uint64_t ack;                     // from the right neighbour: its last read step
  uint64_t pad1[15];
  uint32_t slot[DEPTH][MAX_COUNT];  // messages from the left neighbour
};

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__global__ void __launch_bounds__(THREADS)
ring_steps(const uint32_t* __restrict__ x, uint32_t* __restrict__ out, int count, int iters,
           uint64_t base, Mailbox* own, Mailbox* right, Mailbox* left) {
  uint32_t s[PER_THREAD];
#pragma unroll
  for (int j = 0; j < PER_THREAD; ++j) {
    const int i = threadIdx.x + j * THREADS;
    s[j] = i < count ? x[i] : 0u;
  }
  for (int k = 1; k <= iters; ++k) {
    const uint64_t g = base + (uint64_t)k;
    const int d = (int)(g % DEPTH);
    // the right neighbour must have read the slot's previous message (step g - DEPTH)
    if (threadIdx.x == 0 && g > DEPTH) {
      while (ld_acquire_sys(&own->ack) < g - DEPTH) {
      }
    }
    __syncthreads();
    uint32_t* to = right->slot[d];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
      const int i = threadIdx.x + j * THREADS;
      if (i < count) to[i] = s[j];
    }
    __syncthreads();  // every store of the block is issued before thread 0 signals
    if (threadIdx.x == 0) {
      __threadfence_system();
      st_release_sys(&right->sig, g);
      while (ld_acquire_sys(&own->sig) < g) {
      }  // the left neighbour's message of step g is here
    }
    __syncthreads();
    const volatile uint32_t* from = own->slot[d];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
      const int i = threadIdx.x + j * THREADS;
      if (i < count) s[j] = 2u * s[j] + from[i];
    }
    __syncthreads();  // every read of the slot is done before thread 0 hands it back
    if (threadIdx.x == 0) st_release_sys(&left->ack, g);
  }
#pragma unroll
  for (int j = 0; j < PER_THREAD; ++j) {
    const int i = threadIdx.x + j * THREADS;
    if (i < count) out[i] = s[j];
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int n = ctx->world_size;
  const int right = (rank + 1) % n;      // receives this rank's state every step
  const int left = (rank + n - 1) % n;   // sends its state to this rank every step
  const uint32_t* x = (const uint32_t*)ctx->buffers[0];  // count 32-bit words, the initial state
  uint32_t* out = (uint32_t*)ctx->buffers[1];            // count 32-bit words, the final state
  const size_t count = ctx->buffer_bytes[0] / sizeof(uint32_t);
  const int64_t iters = ctx->params[0];             // steps per call
  void* ws = ctx->workspace;                        // this rank's workspace (zeroed once)
  void* right_ws = ctx->peer_workspace[right];      // the right neighbour's workspace (CUDA IPC)
  void* left_ws = ctx->peer_workspace[left];        // the left neighbour's workspace (CUDA IPC)
  const size_t ws_bytes = ctx->workspace_bytes;     // the same on every rank
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (ctx->num_params < 1 || iters < 1 || iters > (1 << 24)) return 2;
  if (count > MAX_COUNT || ws_bytes < sizeof(Mailbox)) return 2;
  if (count == 0) return 0;   // the same on every rank: nobody signals, nobody waits
  static uint64_t steps = 0;  // steps of earlier calls: every rank makes the same calls
  const uint64_t base = steps;
  steps += (uint64_t)iters;
  ring_steps<<<1, THREADS, 0, stream>>>(x, out, (int)count, (int)iters, base, (Mailbox*)ws,
                                        (Mailbox*)right_ws, (Mailbox*)left_ws);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
