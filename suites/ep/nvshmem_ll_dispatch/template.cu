// MoE low-latency dispatch with NVSHMEM (DeepEP-style): every rank sends each token to the
// rank of each of its experts, into that expert's region of a symmetric receive buffer, and
// signals per (expert, source) how many tokens it sent; every rank then packs what its
// experts received.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: x, topk_idx, recv_x, recv_src, recv_count, recv_from;
  // params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  const int64_t L = num_experts / world;  // experts per rank: global expert rank * L + j is local j
  // shapes (the same on every rank): T tokens per rank, H floats per token, topk experts each
  const int64_t T = num_experts > 0 ? (int64_t)(ctx->buffer_bytes[3] / (sizeof(int32_t) * (size_t)num_experts)) : 0;
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* x = (const float*)ctx->buffers[0];             // (T, H) this rank's tokens
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[1];  // (T, topk); -1: a masked slot
  float* recv_x = (float*)ctx->buffers[2];                    // (L, world*T, H)
  int32_t* recv_src = (int32_t*)ctx->buffers[3];              // (L, world*T)
  int32_t* recv_count = (int32_t*)ctx->buffers[4];            // (L,)
  int32_t* recv_from = (int32_t*)ctx->buffers[5];             // (L, world)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)world; (void)rank; (void)L; (void)T; (void)H; (void)topk; (void)x; (void)topk_idx;
  (void)recv_x; (void)recv_src; (void)recv_count; (void)recv_from; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
