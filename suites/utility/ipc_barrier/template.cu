// A barrier across the GPUs of all ranks, run by a kernel over flags in CUDA-IPC shared
// workspaces.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int world = ctx->world_size;             // 2 .. 16 ranks (COMMBENCH_MAX_RANKS)
  void* flags = ctx->workspace;                  // this rank's workspace, zeroed once
  void* const* peer_flags = ctx->peer_workspace; // peer_flags[r]: rank r's workspace (CUDA IPC)
  const size_t flag_bytes = ctx->workspace_bytes;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)rank; (void)world; (void)flags; (void)peer_flags; (void)flag_bytes; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
