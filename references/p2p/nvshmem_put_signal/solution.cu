// Ring shift with NVSHMEM put-with-signal: every rank's kernel sends its sendbuf to rank + 1
// through the symmetric heap, and the receiver learns of the data from signal words.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design. Symmetric buffer: [flags | slot 0 | slot 1]; a slot holds one whole message
// (kMaxCount floats) and call `epoch` (1, 2, ...) uses slot epoch & 1. A message is cut into
// chunks of `piece` floats (a multiple of 64, derived from count alone, so both ends cut it
// alike). Sender CTAs put chunk c into slot epoch & 1 of rank + 1 with a block-wide
// put-with-signal whose signal data[epoch & 1][c] (on rank + 1) is set to epoch; receiver CTAs
// wait for their own data[epoch & 1][c] >= epoch and copy the chunk from their slot into
// recvbuf, overlapping the chunks still in flight. The last receiver CTA to finish sets ack =
// epoch on rank - 1.
// Across calls: signals hold epochs (they only grow; nothing is reset), and each slot parity
// has its own signals, so a signal of a later call never stands for this call's data. A
// sender reuses a slot two calls later: before its first put of call epoch it waits until its
// ack >= epoch - 2, i.e. rank + 1 has read that slot completely.
constexpr size_t kMaxCount = size_t(4) << 20;  // floats per message (16 MiB)
constexpr int kMaxChunks = 64;
constexpr size_t kMinPiece = 8192;  // floats: 32 KiB
constexpr int kThreads = 512;
constexpr int kMaxCtasPerRole = 16;
constexpr int kUnroll = 4;

struct Flags {
  uint64_t data[2][kMaxChunks];  // set by rank - 1: chunk c of slot p holds call `value`'s data
  uint64_t ack;                  // set by rank + 1: it has read all of call `value`'s slot
  unsigned int readers_done;     // receiver CTAs of the current call that are done (local)
};
constexpr size_t kFlagBytes = 4096;
static_assert(sizeof(Flags) <= kFlagBytes, "the flags fit in front of the slots");
constexpr size_t kSymBytes = kFlagBytes + 2 * kMaxCount * sizeof(float);

// A slot written by a peer during this kernel is read through L2 (ld.global.cg), never through
// the non-coherent read-only path.
template <bool kPeerWritten, typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (kPeerWritten) return __ldcg(p);
  else return __ldg(p);
}

// dst[0 .. n) = src[0 .. n) by the whole CTA: 16-byte accesses, kUnroll loads in flight
template <bool kPeerWritten>
__device__ __forceinline__ void cta_copy(float* __restrict__ dst, const float* __restrict__ src,
                                         size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t nv = n / 4;
    const float4* s = reinterpret_cast<const float4*>(src);
    float4* d = reinterpret_cast<float4*>(dst);
    size_t i = t;
    for (; i + (kUnroll - 1) * T < nv; i += kUnroll * T) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load<kPeerWritten>(s + i + u * T);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * T] = v[u];
    }
    for (; i < nv; i += T) d[i] = load<kPeerWritten>(s + i);
    for (size_t j = nv * 4 + t; j < n; j += T) dst[j] = load<kPeerWritten>(src + j);
  } else {
    for (size_t j = t; j < n; j += T) dst[j] = load<kPeerWritten>(src + j);
  }
}

// CTAs [0, senders) send, CTAs [senders, gridDim.x) receive
__global__ void __launch_bounds__(kThreads)
ring_shift(const float* __restrict__ sendbuf, float* __restrict__ recvbuf, char* sym,
           size_t count, size_t piece, int chunks, int senders, uint64_t epoch) {
  Flags* flags = reinterpret_cast<Flags*>(sym);
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  const int next = rank + 1 < world ? rank + 1 : 0;
  const int prev = rank > 0 ? rank - 1 : world - 1;
  const int parity = (int)(epoch & 1);
  float* slot = reinterpret_cast<float*>(sym + kFlagBytes) + (size_t)parity * kMaxCount;
  if ((int)blockIdx.x < senders) {
    if (threadIdx.x == 0 && epoch > 2)  // rank + 1 has read this slot's previous message
      nvshmem_signal_wait_until(&flags->ack, NVSHMEM_CMP_GE, epoch - 2);
    __syncthreads();
    for (int c = blockIdx.x; c < chunks; c += senders) {
      const size_t lo = (size_t)c * piece;
      const size_t n = count - lo < piece ? count - lo : piece;
      nvshmemx_putmem_signal_nbi_block(slot + lo, sendbuf + lo, n * sizeof(float),
                                       &flags->data[parity][c], epoch, NVSHMEM_SIGNAL_SET,
                                       next);
    }
  } else {
    const int readers = (int)gridDim.x - senders;
    for (int c = (int)blockIdx.x - senders; c < chunks; c += readers) {
      if (threadIdx.x == 0) {
        nvshmem_signal_wait_until(&flags->data[parity][c], NVSHMEM_CMP_GE, epoch);
        __threadfence_system();  // the chunk's data is read only after its signal was seen
      }
      __syncthreads();
      const size_t lo = (size_t)c * piece;
      const size_t n = count - lo < piece ? count - lo : piece;
      cta_copy<true>(recvbuf + lo, slot + lo, n);
    }
    __syncthreads();  // every thread's reads of the slot are done
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(&flags->readers_done, 1u) == (unsigned)readers - 1) {
        flags->readers_done = 0;  // the next call's kernel starts after this one ends
        __threadfence_system();
        nvshmemx_signal_op(&flags->ack, epoch, NVSHMEM_SIGNAL_SET, prev);
      }
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats: the message to send
  float* recvbuf = (float*)ctx->buffers[1];               // count floats: rank - 1's message
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (count > kMaxCount) return 2;
  void* sym = nullptr;
  // the same size in every call: allocated (zero-filled) once, in the first call
  const int rc = nvshmem_symmetric_buffer(ctx, kSymBytes, &sym);
  if (rc != 0) return rc;
  static int sms = 0;
  if (sms == 0) {
    // rank + 1 must be reachable by loads and stores (NVLink peer-to-peer)
    if (nvshmem_ptr(sym, (ctx->rank + 1) % ctx->world_size) == nullptr) return 4;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 3;
  }
  size_t piece = (count + kMaxChunks - 1) / kMaxChunks;
  piece = (piece + 63) / 64 * 64;
  if (piece < kMinPiece) piece = kMinPiece;
  const int chunks = (int)((count + piece - 1) / piece);
  // as many receivers as senders, all CTAs resident at once (a receiver spins on a signal that
  // a peer's sender sets): at most one CTA per multiprocessor
  int per_role = sms / 2 < kMaxCtasPerRole ? sms / 2 : kMaxCtasPerRole;
  if (per_role > chunks) per_role = chunks;
  if (per_role < 1) per_role = 1;
  static uint64_t epoch = 0;  // every rank makes the same calls
  ++epoch;
  ring_shift<<<2 * per_role, kThreads, 0, stream>>>(sendbuf, recvbuf, (char*)sym, count, piece,
                                                    chunks, per_role, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
