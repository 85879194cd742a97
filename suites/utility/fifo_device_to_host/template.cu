// A device-to-host FIFO: a kernel produces one record per element into a bounded ring in
// pinned, mapped host memory while the host consumes the records, places each value where
// its record says, and uploads the result.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT fifo
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];        // count floats, input
  const int32_t* idx = (const int32_t*)ctx->buffers[1];  // count int32, a permutation of 0 .. count-1, input
  float* out = (float*)ctx->buffers[2];                  // count floats, output
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int device = ctx->device;                        // already current
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  (void)x; (void)idx; (void)out; (void)count; (void)device; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
