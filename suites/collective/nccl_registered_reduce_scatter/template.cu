// Reduce-scatter (sum, float32) with NCCL on user buffers that are registered with the
// communicator once (ncclCommRegister) and deregistered once they are gone.
#include <cuda_runtime.h>
#include <nccl.h>

#include "commbench.h"

// >>> COMMBENCH EDIT registration
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  float* sendbuf = (float*)ctx->buffers[0];       // world_size blocks, one per rank
  float* recvbuf = (float*)ctx->buffers[1];       // this rank's block of the sum
  const size_t send_bytes = ctx->buffer_bytes[0];
  const size_t recv_bytes = ctx->buffer_bytes[1];
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT reduce_scatter
  (void)sendbuf; (void)recvbuf; (void)send_bytes; (void)recv_bytes; (void)comm; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
