// All-to-all with NVSHMEM: kernels move the blocks through a symmetric buffer.
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
  const float* sendbuf = (const float*)ctx->buffers[0];  // world_size blocks of count floats
  float* recvbuf = (float*)ctx->buffers[1];               // world_size blocks of count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
