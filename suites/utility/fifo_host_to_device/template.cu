// A host-to-device FIFO: the host pushes work items (chunks of x) into a bounded queue in
// pinned, mapped host memory; a persistent kernel pops them, computes out = 2 * x + 1 over
// each chunk and hands the slots back.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT fifo
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];  // n floats, input
  float* out = (float*)ctx->buffers[1];            // n floats, output
  const size_t n = ctx->buffer_bytes[0] / sizeof(float);
  const int device = ctx->device;                  // already current
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  (void)x; (void)out; (void)n; (void)device; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
