// Periodic 1-D halo exchange with NCCL point-to-point operations: every rank sends the first
// `halo` rows of its field to its left neighbour and the last `halo` rows to its right
// neighbour, and receives theirs into its two ghost buffers.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// The four operations go in one NCCL group, so the sends and receives of all ranks progress
// together (no rank waits on a neighbour that is itself waiting). Operations between the same
// two ranks are matched in the order they are posted: with two ranks both neighbours are one
// rank, so the order matters. Every rank posts its sends "to the left, then to the right" and
// its receives "from the right, then from the left": the first message from a peer is then
// the one that peer sent to its left (this rank, seen from the peer) = the peer's first rows
// = this rank's right ghost, and the second the peer's last rows = this rank's left ghost.
// With three ranks or more each pair carries one message per direction and the order is moot.
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* field = (const float*)ctx->buffers[0];  // rows x row_len, row-major
  float* ghost_left = (float*)ctx->buffers[1];         // halo x row_len
  float* ghost_right = (float*)ctx->buffers[2];        // halo x row_len
  const int64_t rows = ctx->params[0];
  const int64_t halo = ctx->params[1];
  const size_t row_len = rows > 0 ? ctx->buffer_bytes[0] / sizeof(float) / (size_t)rows : 0;
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT exchange
  if (rows < 1 || halo < 1 || halo > rows || world < 1) return 2;
  const int left = (rank - 1 + world) % world;
  const int right = (rank + 1) % world;
  const size_t n = (size_t)halo * row_len;  // elements of one halo: `halo` whole rows
  const float* first_rows = field;
  const float* last_rows = field + (size_t)(rows - halo) * row_len;
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return (int)rc;
  ncclResult_t err[4];
  err[0] = ncclSend(first_rows, n, ncclFloat32, left, comm, stream);
  err[1] = ncclSend(last_rows, n, ncclFloat32, right, comm, stream);
  err[2] = ncclRecv(ghost_right, n, ncclFloat32, right, comm, stream);
  err[3] = ncclRecv(ghost_left, n, ncclFloat32, left, comm, stream);
  rc = ncclGroupEnd();  // closed whatever happened inside
  for (ncclResult_t e : err)
    if (e != ncclSuccess) return (int)e;
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
