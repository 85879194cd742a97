// All-reduce fused with the residual add and RMSNorm (float32) over CUDA IPC, in one kernel:
// every rank sums the partial results of all ranks, adds the residual, and normalizes every
// row, synchronizing with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];         // (T, H) this rank's partial sums
  const float* residual = (const float*)ctx->buffers[1];  // (T, H) the residual stream
  const float* gamma = (const float*)ctx->buffers[2];     // (H) the RMSNorm weight
  float* y = (float*)ctx->buffers[3];                     // (T, H) output: the normalized rows
  float* residual_out = (float*)ctx->buffers[4];          // (T, H) output: sum + residual
  const int64_t H = ctx->num_params >= 1 ? ctx->params[0] : 0;  // hidden
  const size_t T = H > 0 ? ctx->buffer_bytes[0] / (sizeof(float) * (size_t)H) : 0;
  const float eps = 1e-6f;
  // ctx->peer_buffers[r][0]: rank r's x, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)x; (void)residual; (void)gamma; (void)y; (void)residual_out; (void)T; (void)eps;
  (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
