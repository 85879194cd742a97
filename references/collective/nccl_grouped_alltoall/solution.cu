// All-to-all of float32 blocks with NCCL point-to-point operations: block j of every rank's
// sendbuf ends up as block `rank` of rank j's recvbuf.
#include <cuda_runtime.h>
#include <nccl.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// Every send and every receive of the exchange is posted inside one NCCL group: NCCL then
// progresses them together, so no rank's send waits on a peer that is itself still sending.
// The rank's own block takes the same path (a send to itself and the matching receive).
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
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return (int)rc;
  ncclResult_t first = ncclSuccess;  // the first error; the group is closed whatever happens
  for (int i = 0; i < world; ++i) {
    // a rotating order (step i: to rank + i, from rank - i), so the ranks do not all start
    // with the same peer; i == 0 is the rank's own block
    const int to = (rank + i) % world;
    const int from = (rank - i + world) % world;
    ncclResult_t s = ncclSend(sendbuf + (size_t)to * count, count, ncclFloat32, to, comm, stream);
    if (first == ncclSuccess) first = s;
    ncclResult_t r = ncclRecv(recvbuf + (size_t)from * count, count, ncclFloat32, from, comm, stream);
    if (first == ncclSuccess) first = r;
  }
  rc = ncclGroupEnd();
  if (first != ncclSuccess) return (int)first;
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
