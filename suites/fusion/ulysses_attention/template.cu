// Ulysses (DeepSpeed-Ulysses) sequence-parallel attention, float32, over CUDA IPC: the
// queries, keys and values arrive sequence-sharded with all heads; attention runs per head
// over the whole sequence with the heads split across the ranks (an all-to-all to the
// head-sharded layout and one back), synchronizing through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* q = (const float*)ctx->buffers[0];  // (S_local, H, D) this rank's queries
  const float* k = (const float*)ctx->buffers[1];  // (S_local, H, D) this rank's keys
  const float* v = (const float*)ctx->buffers[2];  // (S_local, H, D) this rank's values
  float* o = (float*)ctx->buffers[3];              // (S_local, H, D) this rank's output
  const int64_t H = ctx->num_params >= 2 ? ctx->params[0] : 0;  // heads
  const int64_t D = ctx->num_params >= 2 ? ctx->params[1] : 0;  // head_dim
  const size_t S_local =
      H > 0 && D > 0 ? ctx->buffer_bytes[0] / (sizeof(float) * (size_t)H * (size_t)D) : 0;
  // ctx->peer_buffers[r][i]: rank r's buffer i (q, k, v, o), mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)q; (void)k; (void)v; (void)o; (void)S_local; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
