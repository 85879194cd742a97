// All-to-all with NVSHMEM: kernels move the blocks through a symmetric buffer.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design. Symmetric buffer: [flags | half 0 | half 1]; a half is world slots of `stride` floats
// (256-byte aligned): slot s of PE p receives block p of PE s's sendbuf. Calls alternate
// halves. Every block is cut into pieces of `piece` floats (a multiple of 4); CTA b handles
// piece r * gridDim.x + b of every block, rounds r = 0 .. rounds-1. Warp roles in a CTA:
//   push warps: for every round and every peer p, store the piece of block p into slot `rank`
//     of PE p through nvshmem_ptr (NVLink load/store), then (named barrier of the push warps,
//     system fence) set flag (round, CTA, rank) on every peer to this call's epoch;
//   copy warps: copy this rank's own block into recvbuf (local, overlaps the NVLink traffic),
//     then for every round wait until the flags of all peers reach the epoch and copy the
//     received pieces from the slots into recvbuf (overlapping the later rounds' pushes).
// Across calls: the epoch grows by one per call, so flags never need resetting (a flag already
// set by a peer's next call satisfies >= too). Halves alternate, and a PE begins call k+2 only
// after its call k+1 got every peer's signals, sent after that peer had finished call k, the
// last reader of the half call k+2 overwrites.
constexpr int kPushWarps = 8;
constexpr int kCopyWarps = 8;
constexpr int kPushThreads = 32 * kPushWarps;
constexpr int kCopyThreads = 32 * kCopyWarps;
constexpr int kThreads = kPushThreads + kCopyThreads;
constexpr int kUnroll = 4;
constexpr int kMaxCtas = 256;
constexpr int kMaxRounds = 4;
constexpr int kMaxWorld = COMMBENCH_MAX_RANKS;
constexpr size_t kFlagBytes = (size_t)kMaxRounds * kMaxCtas * kMaxWorld * sizeof(uint64_t);
constexpr size_t kMinCtaElems = 8192;  // at least 32 KiB of data per CTA
constexpr size_t kRoundElems = 8192;   // at least 32 KiB per CTA, round and block

__host__ __device__ __forceinline__ size_t smin(size_t a, size_t b) { return a < b ? a : b; }

__device__ __forceinline__ size_t flag_index(int round, int cta, int src) {
  return ((size_t)round * kMaxCtas + cta) * kMaxWorld + src;
}

// a barrier of `threads` threads (whole warps) of the CTA, other than __syncthreads' barrier 0
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Slots written by a peer during this kernel are read through L2 (ld.global.cg), never through
// the non-coherent read-only path; sendbuf is read-only for the whole kernel.
template <bool kPeerWritten, typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (kPeerWritten) return __ldcg(p);
  else return __ldg(p);
}

// dst[j] = src[j] for j < n by the kGroup threads t = 0 .. kGroup-1: 16-byte accesses when
// both are 16-byte aligned, 4-byte accesses otherwise (blocks of a count not a multiple of 4)
template <int kGroup, bool kPeerWritten>
__device__ __forceinline__ void group_copy(float* dst, const float* src, size_t n, int t) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t nv = n / 4;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    size_t i = t;
    for (; i + (kUnroll - 1) * kGroup < nv; i += kUnroll * kGroup) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load<kPeerWritten>(s + i + u * kGroup);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kGroup] = v[u];
    }
    for (; i < nv; i += kGroup) d[i] = load<kPeerWritten>(s + i);
    for (size_t j = nv * 4 + t; j < n; j += kGroup) dst[j] = load<kPeerWritten>(src + j);
  } else {
    for (size_t j = t; j < n; j += kGroup) dst[j] = load<kPeerWritten>(src + j);
  }
}

__global__ void __launch_bounds__(kThreads)
alltoall_shmem(const float* __restrict__ sendbuf, float* __restrict__ recvbuf, char* sym,
               size_t count, size_t stride, size_t half, size_t piece, int rounds,
               uint64_t epoch) {
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  uint64_t* flags = reinterpret_cast<uint64_t*>(sym);
  float* slots = reinterpret_cast<float*>(sym + kFlagBytes + half);  // this call's half
  const size_t grid = gridDim.x;
  const int cta = blockIdx.x;
  if (threadIdx.x < kPushThreads) {
    const int t = threadIdx.x;
    for (int r = 0; r < rounds; ++r) {
      const size_t lo = smin(count, ((size_t)r * grid + cta) * piece);
      const size_t hi = smin(count, lo + piece);
      for (int k = 1; k < world; ++k) {
        const int p = rank + k < world ? rank + k : rank + k - world;
        float* dst = static_cast<float*>(nvshmem_ptr(slots + (size_t)rank * stride, p));
        group_copy<kPushThreads, false>(dst + lo, sendbuf + (size_t)p * count + lo, hi - lo, t);
      }
      named_sync(1, kPushThreads);  // every push warp's stores of this round come first
      if (t == 0) {
        __threadfence_system();  // ... visible to the peers before the flags
        for (int k = 1; k < world; ++k) {
          const int p = rank + k < world ? rank + k : rank + k - world;
          nvshmemx_signal_op(flags + flag_index(r, cta, rank), epoch, NVSHMEM_SIGNAL_SET, p);
        }
      }
    }
  } else {
    const int t = threadIdx.x - kPushThreads;
    const size_t own = (size_t)rank * count;
    for (int r = 0; r < rounds; ++r) {  // this rank's own block never leaves the GPU
      const size_t lo = smin(count, ((size_t)r * grid + cta) * piece);
      const size_t hi = smin(count, lo + piece);
      group_copy<kCopyThreads, false>(recvbuf + own + lo, sendbuf + own + lo, hi - lo, t);
    }
    for (int r = 0; r < rounds; ++r) {
      const size_t lo = smin(count, ((size_t)r * grid + cta) * piece);
      const size_t hi = smin(count, lo + piece);
      if (t == 0) {
        for (int k = 1; k < world; ++k) {
          const int s = rank - k >= 0 ? rank - k : rank - k + world;
          nvshmem_signal_wait_until(flags + flag_index(r, cta, s), NVSHMEM_CMP_GE, epoch);
        }
        __threadfence_system();
      }
      named_sync(2, kCopyThreads);  // the copy warps read only after the flags were seen
      for (int k = 1; k < world; ++k) {
        const int s = rank - k >= 0 ? rank - k : rank - k + world;
        group_copy<kCopyThreads, true>(recvbuf + (size_t)s * count + lo,
                                       slots + (size_t)s * stride + lo, hi - lo, t);
      }
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // world_size blocks of count floats
  float* recvbuf = (float*)ctx->buffers[1];               // world_size blocks of count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int world = ctx->world_size;
  if (world > kMaxWorld) return 2;
  const size_t stride = (count + 63) / 64 * 64;                // floats per slot (256 B aligned)
  const size_t half = (size_t)world * stride * sizeof(float);  // one set of received blocks
  void* sym = nullptr;
  const int rc = nvshmem_symmetric_buffer(ctx, kFlagBytes + 2 * half, &sym);
  if (rc != 0) return rc;
  static int sms = 0;
  if (sms == 0) {
    for (int p = 0; p < world; ++p)  // every PE must be reachable by loads and stores (NVLink)
      if (nvshmem_ptr(sym, p) == nullptr) return 4;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 3;
  }
  // one CTA per SM at most (all resident: a CTA waits for the same CTA of the peers); the same
  // grid and rounds on every rank (same count, same GPUs)
  size_t grid = (count * world + kMinCtaElems - 1) / kMinCtaElems;
  grid = smin(grid, (size_t)(sms < kMaxCtas ? sms : kMaxCtas));
  if (grid == 0) grid = 1;
  size_t rounds = (count + grid * kRoundElems - 1) / (grid * kRoundElems);
  rounds = rounds < 1 ? 1 : smin(rounds, kMaxRounds);
  size_t piece = (count + grid * rounds - 1) / (grid * rounds);
  piece = (piece + 3) / 4 * 4;
  static uint64_t epoch = 0;  // the same sequence of calls on every rank
  ++epoch;
  const size_t half_off = (epoch & 1) ? half : 0;
  alltoall_shmem<<<(unsigned)grid, kThreads, 0, stream>>>(sendbuf, recvbuf, (char*)sym, count,
                                                           stride, half_off, piece,
                                                           (int)rounds, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
