// Broadcast from a kernel with NVSHMEM: the root's sendbuf reaches every rank's recvbuf through
// the symmetric heap, moved and signalled by the ranks' kernels.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats (the root's is sent)
  float* recvbuf = (float*)ctx->buffers[1];               // count floats: the root's sendbuf
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int root = (int)ctx->params[0];                   // this call's root, 0 .. world_size-1
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)root; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
