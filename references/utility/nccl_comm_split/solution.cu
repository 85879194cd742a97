// All-reduce (sum, float32) within groups of ranks, on sub-communicators split from the
// communicator of all ranks with ncclCommSplit: made once, kept for every later call.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// The group's communicator is split once and kept with what it was made from (the parent
// communicator and the grouping). ncclCommSplit is collective over the parent: every rank
// makes the same calls with the same parameters, so where they change every rank splits
// again at the same call. Ranks keep their order inside a group (key = rank).
namespace {

struct Split {
  ncclComm_t parent = nullptr;
  int64_t groups = 0;
  int64_t blocked = -1;
  ncclComm_t sub = nullptr;
};
Split g_split;

}  // namespace
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
  if (world < 1 || groups < 1 || groups > world || (blocked && world % groups)) return 2;
  if (g_split.sub == nullptr || g_split.parent != comm || g_split.groups != groups ||
      g_split.blocked != blocked) {
    if (g_split.sub != nullptr) {  // a new grouping: every rank of the old group is here too
      ncclCommFinalize(g_split.sub);
      ncclCommDestroy(g_split.sub);
      g_split = Split();
    }
    const int color = blocked ? (int)(rank / (world / groups)) : (int)(rank % groups);
    ncclComm_t sub = nullptr;
    ncclResult_t rc = ncclCommSplit(comm, color, rank, &sub, nullptr);
    if (rc != ncclSuccess) return (int)rc;
    if (sub == nullptr) return 4;
    g_split.parent = comm;
    g_split.groups = groups;
    g_split.blocked = blocked;
    g_split.sub = sub;
  }
  ncclResult_t rc = ncclAllReduce(sendbuf, recvbuf, count, ncclFloat32, ncclSum, g_split.sub,
                                  stream);
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
