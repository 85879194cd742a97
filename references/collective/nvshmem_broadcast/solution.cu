// Broadcast from a kernel with NVSHMEM: the root's sendbuf reaches every rank's recvbuf through
// the symmetric heap, moved and signalled by the ranks' kernels.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design. The ranks form a tree rooted at `root`, numbered relative to it (v = (rank - root)
// mod n); node v's children are v * fan + 1 .. v * fan + fan. Small messages go from the root
// straight to every rank (fan = n - 1: one hop); larger ones down a chain (fan = 1), pipelined
// chunk by chunk, so that no rank sends more than one copy of the message.
// Symmetric buffer: [flags | slot 0 | slot 1]; a slot holds one message and call `epoch`
// (1, 2, ...) uses slot epoch & 1. The message is cut into chunks of `piece` floats (a multiple
// of 64, from count alone, so every rank cuts it alike); CTA b handles chunks b, b + grid, ...:
// it waits until its signal data[epoch & 1][c] >= epoch (not on the root), reads the chunk
// once (the root from its sendbuf, the others from their own slot) and stores it into its
// recvbuf and into the children's slots (NVLink stores through nvshmem_ptr); then it sets
// data[epoch & 1][c] = epoch on every child.
// Across calls: the root, and with it the writer of a slot, changes from call to call. A slot
// is written again two calls later: the last CTA of a rank to finish tells every PE
// (ack[rank] = epoch), and a parent waits for ack[child] >= epoch - 2 before it writes into
// the child's slot. The signals of a parity are set only by calls of that parity, so while a
// child waits for call epoch's chunk, no later call's signal can stand for it.
constexpr size_t kMaxCount = size_t(4) << 20;  // floats per message (16 MiB)
constexpr int kMaxChunks = 64;
constexpr size_t kMinPiece = 8192;          // floats: 32 KiB
constexpr size_t kDirectBytes = 256 << 10;  // messages up to this size go from the root to all
constexpr int kThreads = 512;
constexpr int kMaxCtas = 16;
constexpr int kMaxWorld = COMMBENCH_MAX_RANKS;
constexpr int kUnroll = 4;

struct Flags {
  uint64_t data[2][kMaxChunks];  // set by the parent: chunk c of slot p holds call `value`'s data
  uint64_t ack[kMaxWorld];       // ack[s]: PE s has read all of call `value`'s slot
  unsigned int ctas_done;        // CTAs of the current call that are done (local)
};
constexpr size_t kFlagBytes = 4096;
static_assert(sizeof(Flags) <= kFlagBytes, "the flags fit in front of the slots");
constexpr size_t kSymBytes = kFlagBytes + 2 * kMaxCount * sizeof(float);

// A slot written by the parent during this kernel is read through L2 (ld.global.cg), never
// through the non-coherent read-only path.
template <bool kPeerWritten, typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (kPeerWritten) return __ldcg(p);
  else return __ldg(p);
}

// src[0 .. n) read once by the whole CTA and stored into recv[0 .. n) and into
// dst[j][lo .. lo + n) for every child j < nd: 16-byte accesses, kUnroll loads in flight
template <bool kPeerWritten>
__device__ __forceinline__ void cta_fan_out(float* __restrict__ recv, float* const* dst, int nd,
                                            size_t lo, const float* __restrict__ src,
                                            size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  uintptr_t bits = reinterpret_cast<uintptr_t>(recv) | reinterpret_cast<uintptr_t>(src);
  for (int j = 0; j < nd; ++j) bits |= reinterpret_cast<uintptr_t>(dst[j] + lo);
  if ((bits & 15) == 0) {
    const size_t nv = n / 4;
    const float4* s = reinterpret_cast<const float4*>(src);
    float4* r = reinterpret_cast<float4*>(recv);
    size_t i = t;
    for (; i + (kUnroll - 1) * T < nv; i += kUnroll * T) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load<kPeerWritten>(s + i + u * T);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) r[i + u * T] = v[u];
      for (int j = 0; j < nd; ++j) {
        float4* d = reinterpret_cast<float4*>(dst[j] + lo);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) d[i + u * T] = v[u];
      }
    }
    for (; i < nv; i += T) {
      const float4 v = load<kPeerWritten>(s + i);
      r[i] = v;
      for (int j = 0; j < nd; ++j) reinterpret_cast<float4*>(dst[j] + lo)[i] = v;
    }
    for (size_t k = nv * 4 + t; k < n; k += T) {
      const float v = load<kPeerWritten>(src + k);
      recv[k] = v;
      for (int j = 0; j < nd; ++j) dst[j][lo + k] = v;
    }
  } else {
    for (size_t k = t; k < n; k += T) {
      const float v = load<kPeerWritten>(src + k);
      recv[k] = v;
      for (int j = 0; j < nd; ++j) dst[j][lo + k] = v;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
tree_bcast(const float* __restrict__ sendbuf, float* __restrict__ recvbuf, char* sym,
           size_t count, size_t piece, int chunks, int root, int fan, uint64_t epoch) {
  Flags* flags = reinterpret_cast<Flags*>(sym);
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  const int v = (rank - root + world) % world;  // the rank's place in the tree
  const int parity = (int)(epoch & 1);
  float* slot = reinterpret_cast<float*>(sym + kFlagBytes) + (size_t)parity * kMaxCount;
  const int first_child = v * fan + 1;  // relative numbers of the children
  const int nchild = first_child >= world ? 0
                     : (world - first_child < fan ? world - first_child : fan);
  __shared__ float* child_slot[kMaxWorld];
  if ((int)threadIdx.x < nchild) {
    const int pe = (first_child + (int)threadIdx.x + root) % world;
    child_slot[threadIdx.x] = static_cast<float*>(nvshmem_ptr(slot, pe));
  }
  if (threadIdx.x == 0 && epoch > 2) {  // the children have read these slots two calls ago
    for (int j = 0; j < nchild; ++j)
      nvshmem_signal_wait_until(&flags->ack[(first_child + j + root) % world], NVSHMEM_CMP_GE,
                                epoch - 2);
    __threadfence_system();
  }
  __syncthreads();
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const size_t lo = (size_t)c * piece;
    const size_t n = count - lo < piece ? count - lo : piece;
    if (v != 0) {
      if (threadIdx.x == 0) {
        nvshmem_signal_wait_until(&flags->data[parity][c], NVSHMEM_CMP_GE, epoch);
        __threadfence_system();  // the chunk is read only after its signal was seen
      }
      __syncthreads();
      cta_fan_out<true>(recvbuf + lo, child_slot, nchild, lo, slot + lo, n);
    } else {
      cta_fan_out<false>(recvbuf + lo, child_slot, nchild, lo, sendbuf + lo, n);
    }
    __syncthreads();  // every thread's stores of the chunk are issued
    if (threadIdx.x == 0 && nchild > 0) {
      __threadfence_system();  // ... and visible to the children before their signal
      for (int j = 0; j < nchild; ++j)
        nvshmemx_signal_op(&flags->data[parity][c], epoch, NVSHMEM_SIGNAL_SET,
                           (first_child + j + root) % world);
    }
  }
  __syncthreads();  // every read of this rank's slot is done
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&flags->ctas_done, 1u) == gridDim.x - 1) {
      flags->ctas_done = 0;  // the next call's kernel starts after this one ends
      __threadfence_system();
      for (int p = 0; p < world; ++p)
        nvshmemx_signal_op(&flags->ack[rank], epoch, NVSHMEM_SIGNAL_SET, p);
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats (the root's is sent)
  float* recvbuf = (float*)ctx->buffers[1];               // count floats: the root's sendbuf
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int root = (int)ctx->params[0];                   // this call's root, 0 .. world_size-1
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int world = ctx->world_size;
  if (count > kMaxCount || world > kMaxWorld || root < 0 || root >= world) return 2;
  void* sym = nullptr;
  // the same size in every call: allocated (zero-filled) once, in the first call
  const int rc = nvshmem_symmetric_buffer(ctx, kSymBytes, &sym);
  if (rc != 0) return rc;
  static int sms = 0;
  if (sms == 0) {
    for (int p = 0; p < world; ++p)  // every PE must be reachable by loads and stores (NVLink)
      if (nvshmem_ptr(sym, p) == nullptr) return 4;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 3;
  }
  size_t piece = (count + kMaxChunks - 1) / kMaxChunks;
  piece = (piece + 63) / 64 * 64;
  if (piece < kMinPiece) piece = kMinPiece;
  const int chunks = (int)((count + piece - 1) / piece);
  const int fan = (count * sizeof(float) <= kDirectBytes || world < 3) ? world - 1 : 1;
  // all CTAs resident at once (a CTA spins on a signal a peer's CTA sets): at most one CTA per
  // multiprocessor
  int grid = sms < kMaxCtas ? sms : kMaxCtas;
  if (grid > chunks) grid = chunks;
  if (grid < 1) grid = 1;
  static uint64_t epoch = 0;  // every rank makes the same calls
  ++epoch;
  tree_bcast<<<grid, kThreads, 0, stream>>>(sendbuf, recvbuf, (char*)sym, count, piece, chunks,
                                            root, fan < 1 ? 1 : fan, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
