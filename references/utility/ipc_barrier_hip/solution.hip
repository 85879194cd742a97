// A barrier across the GPUs of all ranks, run by a kernel over flags in the workspaces that
// HIP IPC shares between the ranks (fine-grained device memory, reached across xGMI).
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Mailboxes: 32-bit word q of a rank's workspace is rank q's mailbox there, and holds how many
// barriers rank q has entered (its epoch). One lane per rank, all of them in the first
// wavefront of a single block. Lane q posts this rank's epoch into this rank's mailbox in rank
// q's workspace (a release store at system scope, across xGMI: it also publishes whatever this
// rank wrote before the barrier), then polls mailbox q of its own workspace (an acquire load at
// system scope of fine-grained memory) until rank q's epoch has reached this one. Every post
// leaves at once and every poll runs at once, so one xGMI crossing is the critical path.
// Epochs only grow and a fast peer may already have entered the next barrier, so the test is
// "has reached" (safe across wrap-around), never "equals".
constexpr int LANES = COMMBENCH_MAX_RANKS;  // fits in one wavefront (64) or one warp (32)

struct Mailboxes {
  uint32_t* at[COMMBENCH_MAX_RANKS];  // at[q]: this rank's mailbox in rank q's workspace
};

__global__ void __launch_bounds__(LANES)
xgmi_barrier(Mailboxes out, uint32_t* in, int world, uint32_t epoch) {
  const int q = threadIdx.x;
  if (q >= world) return;
  __hip_atomic_store(out.at[q], epoch, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
  while ((int32_t)(__hip_atomic_load(in + q, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM) -
                   epoch) < 0)
    __builtin_amdgcn_s_sleep(1);  // back off a little between polls of the mailbox
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int world = ctx->world_size;             // 2 .. 16 ranks (COMMBENCH_MAX_RANKS)
  void* flags = ctx->workspace;                  // this rank's workspace, zeroed once
  void* const* peer_flags = ctx->peer_workspace; // peer_flags[r]: rank r's workspace (HIP IPC)
  const size_t flag_bytes = ctx->workspace_bytes;
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  static uint32_t entered = 0;  // barriers entered so far: every rank counts the same calls
  if (world > COMMBENCH_MAX_RANKS || flag_bytes < (size_t)world * sizeof(uint32_t)) return 2;
  Mailboxes out{};
  for (int q = 0; q < world; ++q) out.at[q] = (uint32_t*)peer_flags[q] + rank;
  const uint32_t epoch = ++entered;
  hipLaunchKernelGGL(xgmi_barrier, dim3(1), dim3(LANES), 0, stream, out, (uint32_t*)flags, world,
                     epoch);
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
