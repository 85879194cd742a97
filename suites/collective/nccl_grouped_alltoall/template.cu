// All-to-all of float32 blocks with NCCL point-to-point operations: block j of every rank's
// sendbuf ends up as block `rank` of rank j's recvbuf.
#include <cuda_runtime.h>
#include <nccl.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // world_size blocks of `count`
  float* recvbuf = (float*)ctx->buffers[1];              // world_size blocks of `count`
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / (size_t)world;  // per block
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT alltoall
  (void)sendbuf; (void)recvbuf; (void)rank; (void)world; (void)count; (void)comm; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
