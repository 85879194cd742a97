// Timed waits on the GPU: entry b waits at least ns[b] nanoseconds of %globaltimer time,
// sleeping with __nanosleep between readings, and reports the time it measured.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int64_t* ns = (const int64_t*)ctx->buffers[0];  // count requests, in ns (device)
  int64_t* elapsed = (int64_t*)ctx->buffers[1];        // count measured waits, in ns (device)
  const size_t count = ctx->buffer_bytes[0] / sizeof(int64_t);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)ns; (void)elapsed; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
