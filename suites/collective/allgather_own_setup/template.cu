// All-gather (float32) over CUDA IPC, set-up included: the harness shares nothing between the
// ranks, so everything they share is allocated, exported, exchanged and opened here.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's block: count floats
  float* recvbuf = (float*)ctx->buffers[1];              // all blocks: world * count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // the harness maps no peer buffer and gives no workspace: ctx->peer_buffers and
  // ctx->peer_workspace are NULL; the host helpers work only in set-up calls
  // >>> COMMBENCH EDIT run
  (void)sendbuf; (void)recvbuf; (void)count; (void)rank; (void)world; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
