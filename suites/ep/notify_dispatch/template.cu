// MoE notify step (DeepEP-style, intranode): before a dispatch, every rank learns from every
// other how many tokens it will receive from it and for each of its experts, through the
// workspaces the ranks share over CUDA IPC.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: num_tokens_per_rank, num_tokens_per_expert, recv_from_rank,
  // rank_prefix, num_recv_per_expert, num_recv (no params)
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = (int64_t)(ctx->buffer_bytes[1] / sizeof(int32_t));
  const int64_t local_experts = num_experts / world;  // experts per rank
  const int32_t* num_tokens_per_rank = (const int32_t*)ctx->buffers[0];    // (world,) input
  const int32_t* num_tokens_per_expert = (const int32_t*)ctx->buffers[1];  // (num_experts,) input
  int32_t* recv_from_rank = (int32_t*)ctx->buffers[2];       // (world,) output
  int32_t* rank_prefix = (int32_t*)ctx->buffers[3];          // (world,) output
  int32_t* num_recv_per_expert = (int32_t*)ctx->buffers[4];  // (local_experts,) output
  int32_t* num_recv = (int32_t*)ctx->buffers[5];             // (1,) output
  // ctx->workspace / ctx->peer_workspace[r]: ctx->workspace_bytes each, zeroed once before the
  // first call, IPC-shared, kept across calls; ctx->peer_buffers[r][i]: rank r's buffer i
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)world; (void)rank; (void)local_experts; (void)num_tokens_per_rank;
  (void)num_tokens_per_expert; (void)recv_from_rank; (void)rank_prefix;
  (void)num_recv_per_expert; (void)num_recv; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
