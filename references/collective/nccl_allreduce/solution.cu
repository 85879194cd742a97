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
  ncclResult_t rc = ncclAllReduce(sendbuf, recvbuf, count, ncclFloat32, ncclSum, comm, stream);
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
