// MoE dispatch layout (DeepEP-style): from the experts each token was routed to, the number of
// tokens every rank and every expert receives and the token-to-rank table that a dispatch is
// planned from. Every rank computes its own; there is no communication.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: topk_idx, num_tokens_per_rank, num_tokens_per_expert,
  // is_token_in_rank; params: num_experts
  const int world = ctx->world_size;
  const int64_t num_experts = ctx->params[0];
  // shapes: T tokens (is_token_in_rank holds T * world bytes), topk experts per token
  const int64_t T = (int64_t)(ctx->buffer_bytes[3] / (size_t)world);
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(int64_t) * (size_t)T)) : 0;
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[0];  // (T, topk); -1: a masked slot
  int32_t* num_tokens_per_rank = (int32_t*)ctx->buffers[1];    // (world,)
  int32_t* num_tokens_per_expert = (int32_t*)ctx->buffers[2];  // (num_experts,)
  uint8_t* is_token_in_rank = (uint8_t*)ctx->buffers[3];       // (T, world): 0 or 1
  // ctx->workspace: ctx->workspace_bytes of device scratch, zeroed once before the first call
  // and kept across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)world; (void)num_experts; (void)T; (void)topk; (void)topk_idx;
  (void)num_tokens_per_rank; (void)num_tokens_per_expert; (void)is_token_in_rank; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
