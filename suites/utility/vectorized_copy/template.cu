// out[dst_offset + i] = x[src_offset + i] for 0 <= i < length, with 16-byte accesses where
// source and destination are misaligned by different amounts; every other byte of out stays
// as it was.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const uint8_t* x = (const uint8_t*)ctx->buffers[0];  // count bytes (device), the source
  uint8_t* out = (uint8_t*)ctx->buffers[1];            // count bytes (device), the destination
  const size_t count = ctx->buffer_bytes[0];
  const size_t src_offset = (size_t)ctx->params[0];    // the copy reads x + src_offset ...
  const size_t dst_offset = (size_t)ctx->params[1];    // ... and writes out + dst_offset ...
  const size_t length = (size_t)ctx->params[2];        // ... length bytes
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)x; (void)out; (void)count; (void)src_offset; (void)dst_offset; (void)length;
  (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
