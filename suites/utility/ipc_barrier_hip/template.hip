// A barrier across the GPUs of all ranks, run by a kernel over flags in the workspaces that
// HIP IPC shares between the ranks (fine-grained device memory, reached across xGMI).
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int world = ctx->world_size;             // 2 .. 16 ranks (COMMBENCH_MAX_RANKS)
  void* flags = ctx->workspace;                  // this rank's workspace, zeroed once
  void* const* peer_flags = ctx->peer_workspace; // peer_flags[r]: rank r's workspace (HIP IPC)
  const size_t flag_bytes = ctx->workspace_bytes;
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)rank; (void)world; (void)flags; (void)peer_flags; (void)flag_bytes; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
