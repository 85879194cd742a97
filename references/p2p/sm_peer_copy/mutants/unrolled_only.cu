// Copy this rank's sendbuf into the next rank's recvbuf with a kernel (no copy engine).
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// mutant: handles only whole unrolled groups: the remainder words are never copied
// Each thread moves UNROLL 16-byte words per iteration of a grid-stride loop: all loads are
// issued before the stores so enough bytes are in flight to cover NVLink's latency.
constexpr int UNROLL = 4;
constexpr int THREADS = 512;

__global__ void __launch_bounds__(THREADS) copy16(const uint4* __restrict__ src,
                                                  uint4* __restrict__ dst, size_t words) {
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < words; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) dst[i + u * stride] = v[u];
  }
}

__global__ void copy_tail(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                          size_t n) {
  size_t i = threadIdx.x;
  if (i < n) dst[i] = src[i];
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const void* src = ctx->buffers[0];                      // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];
  const int next = (ctx->rank + 1) % ctx->world_size;
  void* dst = ctx->peer_buffers[next][1];                 // the next rank's recvbuf (CUDA IPC)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const size_t words = bytes / 16;
  const size_t tail = bytes - words * 16;
  if (words) {
    static int sms = 0;
    if (!sms) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device);
    size_t blocks = (words + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
    if (blocks > (size_t)sms * 2) blocks = (size_t)sms * 2;
    copy16<<<(unsigned)blocks, THREADS, 0, stream>>>((const uint4*)src, (uint4*)dst, words);
  }
  if (tail) {
    copy_tail<<<1, 32, 0, stream>>>((const unsigned char*)src + words * 16,
                                    (unsigned char*)dst + words * 16, tail);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
