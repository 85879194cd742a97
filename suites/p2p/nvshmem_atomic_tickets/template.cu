// Tickets from one counter on PE 0: every item of every rank reserves a range of consecutive
// tickets with NVSHMEM atomics, from a kernel.
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
  const int32_t* want = (const int32_t*)ctx->buffers[0];  // count items: tickets each needs
  int64_t* first = (int64_t*)ctx->buffers[1];              // count items: first ticket of each
  const size_t count = ctx->buffer_bytes[0] / sizeof(int32_t);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)want; (void)first; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
