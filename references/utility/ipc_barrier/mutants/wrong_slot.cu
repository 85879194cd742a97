// A barrier across the GPUs of all ranks, run by a kernel over flags in CUDA-IPC shared
// workspaces.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// mutant: waits on the slot it has just raised in the peer's workspace instead of the peer's
// slot in its own, so the wait passes at once: the barrier does not wait at all
// One warp, one thread per rank. Slot q of a rank's workspace says how many barriers rank q has
// entered (the epoch). Thread q raises this rank's slot in rank q's workspace to the epoch
// (a release store over NVLink: also orders this rank's earlier writes before the arrival),
// then spins until slot q of this rank's own workspace has reached the epoch (an acquire
// load). Epochs only grow, and a slot may already be one ahead (a fast peer has entered the
// next barrier), so the test is "has reached", never "equals".
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

struct Slots {
  uint32_t* at[COMMBENCH_MAX_RANKS];  // at[q]: this rank's slot in rank q's workspace
};

__global__ void __launch_bounds__(32) gpu_barrier(Slots remote, const uint32_t* mine, int world,
                                                  uint32_t epoch) {
  const int q = threadIdx.x;
  if (q < world) {
    store_release_sys(remote.at[q], epoch);                   // arrive at rank q
    while ((int32_t)(load_acquire_sys(remote.at[q]) - epoch) < 0) {  // until rank q has arrived here
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int world = ctx->world_size;             // 2 .. 16 ranks (COMMBENCH_MAX_RANKS)
  void* flags = ctx->workspace;                  // this rank's workspace, zeroed once
  void* const* peer_flags = ctx->peer_workspace; // peer_flags[r]: rank r's workspace (CUDA IPC)
  const size_t flag_bytes = ctx->workspace_bytes;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  static uint32_t epoch = 0;  // barriers entered so far: the same count on every rank
  if (world > COMMBENCH_MAX_RANKS || flag_bytes < world * sizeof(uint32_t)) return 2;
  Slots remote{};
  for (int q = 0; q < world; ++q) remote.at[q] = (uint32_t*)peer_flags[q] + rank;
  ++epoch;
  gpu_barrier<<<1, 32, 0, stream>>>(remote, (const uint32_t*)flags, world, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
