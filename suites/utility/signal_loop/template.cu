// An iterated ring exchange inside one kernel: in every step each rank stores its state into
// its right neighbour's mailbox, signals it, waits for its left neighbour's signal and folds
// the received state into its own.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int n = ctx->world_size;
  const int right = (rank + 1) % n;      // receives this rank's state every step
  const int left = (rank + n - 1) % n;   // sends its state to this rank every step
  const uint32_t* x = (const uint32_t*)ctx->buffers[0];  // count 32-bit words, the initial state
  uint32_t* out = (uint32_t*)ctx->buffers[1];            // count 32-bit words, the final state
  const size_t count = ctx->buffer_bytes[0] / sizeof(uint32_t);
  const int64_t iters = ctx->params[0];             // steps per call
  void* ws = ctx->workspace;                        // this rank's workspace (zeroed once)
  void* right_ws = ctx->peer_workspace[right];      // the right neighbour's workspace (CUDA IPC)
  void* left_ws = ctx->peer_workspace[left];        // the left neighbour's workspace (CUDA IPC)
  const size_t ws_bytes = ctx->workspace_bytes;     // the same on every rank
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  (void)x; (void)out; (void)count; (void)iters; (void)ws; (void)right_ws; (void)left_ws;
  (void)ws_bytes; (void)stream;
  return -1;  // not implemented
  // <<< COMMBENCH EDIT
}
