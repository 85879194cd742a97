// Reduce-scatter (sum, float32) over CUDA IPC: every rank reads its own block of every rank's
// sendbuf straight from the peers' memory and writes the sum into its recvbuf, synchronizing
// with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // n blocks of count floats
  float* recvbuf = (float*)ctx->buffers[1];              // the sum of block `rank`: count floats
  const size_t count = ctx->buffer_bytes[1] / sizeof(float);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
