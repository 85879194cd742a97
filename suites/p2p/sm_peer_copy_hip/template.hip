// Push this rank's sendbuf into the next rank's recvbuf with a kernel whose stores go straight
// into the peer GPU's memory over xGMI (no copy engine).
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const void* src = ctx->buffers[0];                      // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];              // 4 B .. 256 MiB
  const int next = (ctx->rank + 1) % ctx->world_size;
  void* dst = ctx->peer_buffers[next][1];                 // the next rank's recvbuf (HIP IPC)
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)src; (void)bytes; (void)dst; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
