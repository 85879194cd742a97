// Periodic 1-D halo exchange with RCCL point-to-point operations on AMD Instinct GPUs (xGMI):
// every rank sends the first `halo` rows of its field to its left neighbour and the last
// `halo` rows to its right neighbour, and receives theirs into its two ghost buffers.
#include <hip/hip_runtime.h>
#include <rccl/rccl.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// All four transfers are posted inside one RCCL group, so each rank's sends and receives are
// launched together and progress together: no rank's send waits on a receive that its
// neighbour would post only after its own send completed (which, for halos larger than
// RCCL's staging buffers, would deadlock the ring).
//
// RCCL matches the operations between one pair of ranks in the order they are posted. With
// three ranks or more, a pair exchanges one message in each direction and the order does not
// matter; with two ranks, the left and the right neighbour are the same rank and two
// messages travel each way. Every rank therefore posts its sends as "to the left, then to the
// right" and its receives as "from the right, then from the left": the first message a rank
// gets from its peer is what the peer sent to its left (here) = the peer's first rows = this
// rank's right ghost; the second is the peer's last rows = this rank's left ghost.
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
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;  // an RCCL communicator of all ranks
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT exchange
  if (rows < 1 || halo < 1 || halo > rows || world < 1) return 2;
  const int left = (rank + world - 1) % world;
  const int right = (rank + 1) % world;
  const size_t n = (size_t)halo * row_len;  // values in one halo: `halo` whole rows
  const float* head = field;                                        // the first `halo` rows
  const float* tail = field + (size_t)(rows - halo) * row_len;      // the last `halo` rows
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return (int)rc;
  const ncclResult_t posted[4] = {
      ncclSend(head, n, ncclFloat32, left, comm, stream),
      ncclSend(tail, n, ncclFloat32, right, comm, stream),
      ncclRecv(ghost_right, n, ncclFloat32, right, comm, stream),
      ncclRecv(ghost_left, n, ncclFloat32, left, comm, stream),
  };
  rc = ncclGroupEnd();  // the group is closed whatever was posted inside it
  for (const ncclResult_t e : posted)
    if (e != ncclSuccess) return (int)e;
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
