// Ring shift with NVSHMEM put-with-signal: every rank's kernel sends its sendbuf to rank + 1
// through the symmetric heap, and the receiver learns of the data from signal words.
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
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats: the message to send
  float* recvbuf = (float*)ctx->buffers[1];               // count floats: rank - 1's message
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
