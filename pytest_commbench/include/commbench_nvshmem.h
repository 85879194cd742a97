// pytest-commbench: NVSHMEM set-up shared by the NVSHMEM tasks (part of the harness contract).
//
// Include after <nvshmem.h>, <nvshmemx.h> and "commbench.h". Defines
//     static int nvshmem_symmetric_buffer(const commbench_ctx* ctx, size_t bytes, void** sym);
// which initializes NVSHMEM on its first call and hands out one symmetric buffer.
#ifndef COMMBENCH_NVSHMEM_H
#define COMMBENCH_NVSHMEM_H

#include <cuda_runtime.h>
#include <stdlib.h>

// ---- set-up given by the harness contract (not editable) --------------------------------
// NVSHMEM is initialized on the first call (unique-id bootstrap: rank 0 creates the id, the
// harness broadcasts it, rank r joins as PE r of world_size), with this rank's device current.
// One host: NVLink (P2P) is the only transport. The symmetric buffer comes from nvshmem_calloc
// (zero-filled), is reallocated only when a call asks for more bytes than it has, and keeps its
// contents from call to call otherwise.
static bool g_shmem_ready = false;
static void* g_sym = nullptr;
static size_t g_sym_bytes = 0;

// Collective: every rank calls it in the same call with the same `bytes`. On success (0)
// *sym is a symmetric buffer (nvshmem_malloc heap) of at least `bytes` bytes on every PE,
// zero-filled when it was (re)allocated in this call.
[[maybe_unused]] static int nvshmem_symmetric_buffer(const commbench_ctx* ctx, size_t bytes,
                                                     void** sym) {
  if (!g_shmem_ready) {
    setenv("NVSHMEM_REMOTE_TRANSPORT", "none", 0);
    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    int rc = 0;
    if (ctx->rank == 0 && nvshmemx_get_uniqueid(&id) != 0) rc = 20;
    if (ctx->broadcast(ctx->host, &id, sizeof(id), 0) != 0) return 21;
    if (rc != 0) return rc;
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    if (nvshmemx_set_attr_uniqueid_args(ctx->rank, ctx->world_size, &id, &attr) != 0) return 22;
    if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) return 23;
    if (nvshmem_my_pe() != ctx->rank || nvshmem_n_pes() != ctx->world_size) return 24;
    g_shmem_ready = true;
  }
  if (bytes > g_sym_bytes) {
    const size_t granule = size_t(2) << 20;
    const size_t want = (bytes + granule - 1) / granule * granule;
    if (cudaDeviceSynchronize() != cudaSuccess) return 25;
    if (g_sym != nullptr) nvshmem_free(g_sym);
    g_sym = nullptr;
    g_sym_bytes = 0;
    g_sym = nvshmem_calloc(want, 1);
    if (g_sym == nullptr) return 26;
    // the zero fill is complete on every PE before any PE's kernel stores into the buffer
    if (cudaDeviceSynchronize() != cudaSuccess) return 27;
    if (ctx->barrier(ctx->host) != 0) return 28;
    g_sym_bytes = want;
  }
  *sym = g_sym;
  return 0;
}
// ------------------------------------------------------------------------------------------

#endif  // COMMBENCH_NVSHMEM_H
