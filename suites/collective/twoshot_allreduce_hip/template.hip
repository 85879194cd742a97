// Two-shot all-reduce (sum, float32) over HIP IPC on AMD GPUs joined by xGMI: a reduce-scatter
// (each rank reduces one slice of the buffer, loading it from every rank's sendbuf) and an
// all-gather of the reduced slices, synchronized through flags in an IPC-shared workspace.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];   // this rank's input: count floats
  float* recvbuf = (float*)ctx->buffers[1];               // this rank's output: count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, opened here through HIP IPC
  // ctx->workspace / ctx->peer_workspace[r]: fine-grained, zeroed once, kept across calls
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)sendbuf; (void)recvbuf; (void)count; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
