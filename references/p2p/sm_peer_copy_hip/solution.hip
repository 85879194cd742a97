// Push this rank's sendbuf into the next rank's recvbuf with a kernel whose stores go straight
// into the peer GPU's memory over xGMI (no copy engine).
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Stores to a peer GPU travel over xGMI as posted writes; what fills the link is many 16-byte
// stores in flight from many compute units at once. A grid-stride loop in which each lane
// first loads DEPTH 16-byte words of sendbuf (local HBM) into registers and only then stores
// them to the peer keeps DEPTH * 16 bytes per lane, DEPTH KiB per 64-lane wavefront, on the way.
// The words left over from whole DEPTH-groups go one per lane; the last bytes % 16 bytes (at
// most 15) go one byte per lane of block 0 in the same launch: a second kernel would cost a
// second launch, and at small sizes the launch is most of the call.
constexpr int BLOCK = 256;  // four wavefronts of 64 lanes on gfx942 (eight warps elsewhere)
constexpr int DEPTH = 4;    // 16-byte words in flight per lane

struct PeerCopy {
  const uint4* src;          // sendbuf, whole 16-byte words
  uint4* dst;                // the peer's recvbuf
  size_t words;
  const unsigned char* src_tail;  // the bytes after the last whole word
  unsigned char* dst_tail;
  int tail;                  // 0 .. 15
};

__global__ void __launch_bounds__(BLOCK) push_words(PeerCopy c) {
  const size_t stride = (size_t)gridDim.x * BLOCK;
  size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x;
  for (; i + (DEPTH - 1) * stride < c.words; i += DEPTH * stride) {
    uint4 r[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) r[d] = c.src[i + d * stride];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) c.dst[i + d * stride] = r[d];
  }
  for (; i < c.words; i += stride) c.dst[i] = c.src[i];
  if (blockIdx.x == 0 && (int)threadIdx.x < c.tail) c.dst_tail[threadIdx.x] = c.src_tail[threadIdx.x];
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const void* src = ctx->buffers[0];                      // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];              // 4 B .. 256 MiB
  const int next = (ctx->rank + 1) % ctx->world_size;
  void* dst = ctx->peer_buffers[next][1];                 // the next rank's recvbuf (HIP IPC)
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  static int cus = 0;  // compute units of this GPU (304 on an MI325X), asked once
  if (cus == 0 &&
      hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, ctx->device) != hipSuccess)
    return 1;
  PeerCopy c;
  c.words = bytes / 16;
  c.tail = (int)(bytes % 16);
  c.src = (const uint4*)src;
  c.dst = (uint4*)dst;
  c.src_tail = (const unsigned char*)src + c.words * 16;
  c.dst_tail = (unsigned char*)dst + c.words * 16;
  // one DEPTH-group per lane where the message is small; at most four blocks per compute unit
  // (a grid-stride loop covers the rest), never fewer than one block (the tail)
  size_t blocks = (c.words + (size_t)BLOCK * DEPTH - 1) / ((size_t)BLOCK * DEPTH);
  if (blocks < 1) blocks = 1;
  if (blocks > (size_t)cus * 4) blocks = (size_t)cus * 4;
  hipLaunchKernelGGL(push_words, dim3((unsigned)blocks), dim3(BLOCK), 0, stream, c);
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
