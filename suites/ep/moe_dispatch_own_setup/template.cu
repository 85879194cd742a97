// MoE expert-parallel dispatch over NVLink (DeepEP-style, intranode), set-up included: every
// rank sends each of its tokens to the ranks that host the token's experts; the harness shares
// nothing between the ranks, so whatever they share is allocated, exported, exchanged and
// opened here.
#include <cuda_runtime.h>
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
  float* recv_x = (float*)ctx->buffers[2];                    // (world*T, H) rows received
  int64_t* recv_src = (int64_t*)ctx->buffers[3];              // (world*T, 2) their origins
  int64_t* num_recv = (int64_t*)ctx->buffers[4];              // (1,) this rank's row count
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // the harness maps no peer buffer and gives no workspace: ctx->peer_buffers and
  // ctx->peer_workspace are NULL; the host helpers work only in set-up calls
  // >>> COMMBENCH EDIT run
  (void)world; (void)rank; (void)num_experts; (void)T; (void)H; (void)topk; (void)x;
  (void)topk_idx; (void)recv_x; (void)recv_src; (void)num_recv; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
