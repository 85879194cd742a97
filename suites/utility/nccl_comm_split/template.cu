// All-reduce (sum, float32) within groups of ranks, on sub-communicators split from the
// communicator of all ranks with ncclCommSplit: made once, kept for every later call.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];
  float* recvbuf = (float*)ctx->buffers[1];
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int64_t groups = ctx->params[0];   // G, the number of groups
  const int64_t blocked = ctx->params[1];  // 0: rank r is in group r % G; 1: in r / (n / G)
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;  // all ranks
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT allreduce
  (void)sendbuf; (void)recvbuf; (void)count; (void)groups; (void)blocked; (void)rank;
  (void)world; (void)comm; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
