// GEMM fused with an all-reduce at tile granularity (the row-parallel linear layer of tensor
// parallelism): every rank multiplies its slice of the inner dimension, and every rank ends
// with the sum of all ranks' products. The partial tiles travel between the GPUs through
// CUDA IPC, with per-tile flags, while the GEMM is still running.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: a (m, k), b (k, n), c (m, n); float32, row-major, C-contiguous
  const float* a = (const float*)ctx->buffers[0];  // this rank's k columns of the whole A
  const float* b = (const float*)ctx->buffers[1];  // this rank's k rows of the whole B
  float* c = (float*)ctx->buffers[2];              // out: the sum over all ranks of a @ b
  // the shapes, from the buffer sizes: |a| |c| / |b| = m^2 (in elements)
  const double ea = (double)(ctx->buffer_bytes[0] / sizeof(float));
  const double eb = (double)(ctx->buffer_bytes[1] / sizeof(float));
  const double ec = (double)(ctx->buffer_bytes[2] / sizeof(float));
  const int64_t m = eb > 0 ? (int64_t)llround(sqrt(ea * ec / eb)) : 0;
  const int64_t k = m > 0 ? (int64_t)(ea / (double)m) : 0;
  const int64_t n = m > 0 ? (int64_t)(ec / (double)m) : 0;
  // ctx->peer_buffers[r][i]: rank r's buffer i, mapped here through CUDA IPC
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes on every rank, zeroed once
  // before the first call, IPC-shared, kept across calls (flags, staged tiles)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)a; (void)b; (void)c; (void)m; (void)k; (void)n; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
