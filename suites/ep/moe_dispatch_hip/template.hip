// MoE expert-parallel dispatch over xGMI (DeepEP-style, intranode, AMD Instinct): every rank
// sends each of its tokens to the ranks that host the token's experts, with kernels that
// write straight into the peers' buffers through HIP IPC.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: x, topk_idx, recv_x, recv_src, num_recv; params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  // shapes (the same on every rank): T tokens per rank, H floats per token, topk experts each
  const int64_t T = (int64_t)(ctx->buffer_bytes[3] / (2 * sizeof(int64_t) * (size_t)world));
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* x = (const float*)ctx->buffers[0];             // (T, H) this rank's tokens
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[1];  // (T, topk) their experts
  int64_t* num_recv = (int64_t*)ctx->buffers[4];              // (1,) this rank's row count
  // rank r's recv_x (world*T, H) float and recv_src (world*T, 2) int64, mapped on this GPU
  // through HIP IPC (r == rank included): ctx->peer_buffers[r][2] and ctx->peer_buffers[r][3]
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before
  // the first call, IPC-shared, kept across calls
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)world; (void)rank; (void)num_experts; (void)T; (void)H; (void)topk;
  (void)x; (void)topk_idx; (void)num_recv; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
