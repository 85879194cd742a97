// GPU-initiated ping-pong between ranks 0 and 1 over xGMI: stores into the peer's memory,
// flags in the HIP-IPC shared (fine-grained) workspaces, one kernel per rank and call.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
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
  (void)sendbuf; (void)bytes; (void)peer_recvbuf; (void)flags; (void)peer_flags;
  (void)flag_bytes; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
