// All-gather with NCCL's device API: kernels store into the peers' symmetric windows (LSA).
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <string.h>

#include "commbench.h"

// ---- set-up given by the harness contract (not editable) --------------------------------
// The device communicator has kLsaBarriers LSA barriers (indices 0 .. kLsaBarriers-1 of
// dev.lsaBarrier), created on the first call. The symmetric window is memory from
// ncclMemAlloc registered with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) on every rank:
// same size everywhere, reachable from every rank's kernels through ncclGetLsaPointer. It is
// reallocated (contents undefined) only when a call asks for more bytes than it has, and keeps
// its contents from call to call otherwise.
constexpr int kLsaBarriers = 256;

struct NcclDeviceState {
  bool ready = false;
  ncclDevComm dev;
  ncclWindow_t win = nullptr;
  void* base = nullptr;
  size_t bytes = 0;
};
static NcclDeviceState g_nccl;

// Collective: every rank calls it in the same call with the same `bytes`. On success (0) *dev
// is the device communicator and *win a symmetric window of at least `bytes` bytes on every
// rank. Every rank must be load/store accessible (one NVLink domain; LSA rank == rank).
[[maybe_unused]] static int nccl_symmetric_window(const commbench_ctx* ctx, size_t bytes,
                                                  ncclDevComm* dev, ncclWindow_t* win) {
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  if (comm == nullptr) return 10;
  if (!g_nccl.ready) {
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
    ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs));
#endif
    reqs.lsaBarrierCount = kLsaBarriers;
    if (ncclDevCommCreate(comm, &reqs, &g_nccl.dev) != ncclSuccess) return 11;
    if (g_nccl.dev.lsaSize != ctx->world_size || g_nccl.dev.lsaRank != ctx->rank) return 12;
    g_nccl.ready = true;
  }
  if (bytes > g_nccl.bytes) {
    const size_t granule = size_t(2) << 20;
    const size_t want = (bytes + granule - 1) / granule * granule;
    if (cudaDeviceSynchronize() != cudaSuccess) return 13;
    if (g_nccl.win != nullptr) {
      if (ncclCommWindowDeregister(comm, g_nccl.win) != ncclSuccess) return 14;
      if (ncclMemFree(g_nccl.base) != ncclSuccess) return 15;
      g_nccl.win = nullptr;
      g_nccl.base = nullptr;
      g_nccl.bytes = 0;
    }
    if (ncclMemAlloc(&g_nccl.base, want) != ncclSuccess) return 16;
    if (ncclCommWindowRegister(comm, g_nccl.base, want, &g_nccl.win, NCCL_WIN_COLL_SYMMETRIC) !=
        ncclSuccess)
      return 17;
    g_nccl.bytes = want;
  }
  *dev = g_nccl.dev;
  *win = g_nccl.win;
  return 0;
}
// ------------------------------------------------------------------------------------------

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats
  float* recvbuf = (float*)ctx->buffers[1];               // world_size * count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
