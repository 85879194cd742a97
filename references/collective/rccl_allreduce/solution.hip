// Sum all ranks' sendbuf into every rank's recvbuf with RCCL (AMD's collective library, whose
// API is NCCL's by name) on AMD Instinct GPUs linked by xGMI.
#include <hip/hip_runtime.h>
#include <rccl/rccl.h>

#include "commbench.h"

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];
  float* recvbuf = (float*)ctx->buffers[1];
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;  // an RCCL communicator of all ranks
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT allreduce
  // one call: RCCL picks ring or tree and the protocol by size, and drives every xGMI link
  const ncclResult_t rc = ncclAllReduce(sendbuf, recvbuf, count, ncclFloat32, ncclSum, comm, stream);
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
