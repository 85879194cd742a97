// Sum all ranks' sendbuf into every rank's recvbuf with NCCL.
#include <cuda_runtime.h>
#include <nccl.h>

#include "commbench.h"

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];
  float* recvbuf = (float*)ctx->buffers[1];
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT allreduce
  (void)sendbuf; (void)recvbuf; (void)count; (void)comm; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
