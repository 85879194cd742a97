// Tile pipeline across GPUs with NVSHMEM: every rank computes tiles and streams them to the next
// rank through a small ring of tile slots in the symmetric heap, while it consumes the tiles
// its previous rank streams to it.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// The staging area every rank has (fixed): kRingTiles slots of kTile floats in the symmetric
// heap, then kSignalWords 64-bit words for signals. Zero-filled before the first call, kept
// from call to call; the only symmetric memory a solution may use.
constexpr size_t kTile = 16384;  // floats per tile (64 KiB); the last tile of a call may be shorter
constexpr int kRingTiles = 8;    // tile slots per rank
constexpr int kSignalWords = 512;

// >>> COMMBENCH EDIT kernels
// Design. One kernel per rank and call, with two kinds of CTAs: producers compute
// y = 2 * x + 1 for a tile and store it (NVLink stores through nvshmem_ptr) into a slot of
// rank + 1's ring; consumers wait for a tile in this rank's own ring, write
// out = 3 * y - x (this rank's x) and free the slot. Tiles are numbered over every call:
// tile t of a call is tile g = base + t of the stream (base = the tiles of all earlier calls,
// the same on every rank), and lives in slot g % kRingTiles. Signals (never reset, they only
// grow): full[i] on the consumer, set by the producer to g + 1 once tile g is in slot i;
// freed[i] on the producer, set by the consumer to g + 1 once it has read tile g out of slot
// i. A producer may fill slot i with tile g once freed[i] >= g + 1 - kRingTiles (the slot's
// previous tile, g - kRingTiles, has been read); a consumer reads tile g once
// full[i] >= g + 1. The stream runs on across calls, so back-to-back calls need nothing more.
// Tile t is produced by producer CTA t % P and consumed by consumer CTA t % P, in order; with
// P <= kRingTiles CTAs a side, every tile a CTA waits for is one that a running CTA brings.
constexpr int kThreads = 512;
constexpr int kUnroll = 4;

// y = 2 * x + 1 for x[0 .. n) into dst[0 .. n) (rank + 1's slot), by the whole CTA
__device__ __forceinline__ void cta_produce(float* __restrict__ dst, const float* __restrict__ x,
                                            size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(x)) & 15) == 0) {
    const size_t nv = n / 4;
    const float4* s = reinterpret_cast<const float4*>(x);
    float4* d = reinterpret_cast<float4*>(dst);
    size_t i = t;
    for (; i + (kUnroll - 1) * T < nv; i += kUnroll * T) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(s + i + u * T);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        d[i + u * T] = make_float4(2.f * v[u].x + 1.f, 2.f * v[u].y + 1.f, 2.f * v[u].z + 1.f,
                                   2.f * v[u].w + 1.f);
    }
    for (; i < nv; i += T) {
      const float4 v = __ldg(s + i);
      d[i] = make_float4(2.f * v.x + 1.f, 2.f * v.y + 1.f, 2.f * v.z + 1.f, 2.f * v.w + 1.f);
    }
    done = nv * 4;
  }
  for (size_t j = done + t; j < n; j += T) dst[j] = 2.f * __ldg(x + j) + 1.f;
}

// out[0 .. n) = 3 * y - x with y from this rank's slot (written by rank - 1 during this call:
// read through L2, ld.global.cg), by the whole CTA
__device__ __forceinline__ void cta_consume(float* __restrict__ out, const float* __restrict__ y,
                                            const float* __restrict__ x, size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(y) |
        reinterpret_cast<uintptr_t>(x)) & 15) == 0) {
    const size_t nv = n / 4;
    const float4* ys = reinterpret_cast<const float4*>(y);
    const float4* xs = reinterpret_cast<const float4*>(x);
    float4* d = reinterpret_cast<float4*>(out);
    size_t i = t;
    for (; i + (kUnroll - 1) * T < nv; i += kUnroll * T) {
      float4 a[kUnroll], b[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        a[u] = __ldcg(ys + i + u * T);
        b[u] = __ldg(xs + i + u * T);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        d[i + u * T] = make_float4(3.f * a[u].x - b[u].x, 3.f * a[u].y - b[u].y,
                                   3.f * a[u].z - b[u].z, 3.f * a[u].w - b[u].w);
    }
    for (; i < nv; i += T) {
      const float4 a = __ldcg(ys + i), b = __ldg(xs + i);
      d[i] = make_float4(3.f * a.x - b.x, 3.f * a.y - b.y, 3.f * a.z - b.z, 3.f * a.w - b.w);
    }
    done = nv * 4;
  }
  for (size_t j = done + t; j < n; j += T) out[j] = 3.f * __ldcg(y + j) - __ldg(x + j);
}

// CTAs [0, P) produce, CTAs [P, 2P) consume
__global__ void __launch_bounds__(kThreads)
tile_pipeline(const float* __restrict__ x, float* __restrict__ out, float* ring,
              uint64_t* signals, size_t count, size_t tiles, int P, uint64_t base) {
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  const int next = rank + 1 < world ? rank + 1 : 0;
  const int prev = rank > 0 ? rank - 1 : world - 1;
  uint64_t* full = signals;                // [kRingTiles], set by rank - 1
  uint64_t* freed = signals + kRingTiles;  // [kRingTiles], set by rank + 1
  if ((int)blockIdx.x < P) {
    float* peer_ring = static_cast<float*>(nvshmem_ptr(ring, next));
    for (size_t t = blockIdx.x; t < tiles; t += P) {
      const uint64_t g = base + t;
      const int i = (int)(g % kRingTiles);
      if (threadIdx.x == 0) {
        if (g >= kRingTiles)  // the slot's previous tile has been read
          nvshmem_signal_wait_until(&freed[i], NVSHMEM_CMP_GE, g + 1 - kRingTiles);
        __threadfence_system();
      }
      __syncthreads();
      const size_t lo = t * kTile;
      const size_t n = count - lo < kTile ? count - lo : kTile;
      cta_produce(peer_ring + (size_t)i * kTile, x + lo, n);
      __syncthreads();  // every thread's stores of the tile are issued
      if (threadIdx.x == 0) {
        __threadfence_system();  // ... and visible on rank + 1 before the signal
        nvshmemx_signal_op(&full[i], g + 1, NVSHMEM_SIGNAL_SET, next);
      }
    }
  } else {
    for (size_t t = blockIdx.x - P; t < tiles; t += P) {
      const uint64_t g = base + t;
      const int i = (int)(g % kRingTiles);
      if (threadIdx.x == 0) {
        nvshmem_signal_wait_until(&full[i], NVSHMEM_CMP_GE, g + 1);
        __threadfence_system();  // the tile is read only after its signal was seen
      }
      __syncthreads();
      const size_t lo = t * kTile;
      const size_t n = count - lo < kTile ? count - lo : kTile;
      cta_consume(out + lo, ring + (size_t)i * kTile, x + lo, n);
      __syncthreads();  // every thread's reads of the slot are done
      if (threadIdx.x == 0) {
        __threadfence();
        nvshmemx_signal_op(&freed[i], g + 1, NVSHMEM_SIGNAL_SET, prev);
      }
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];  // count floats: this rank's input
  float* out = (float*)ctx->buffers[1];            // count floats: this rank's output
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  void* staging = nullptr;
  const int rc = nvshmem_symmetric_buffer(
      ctx, kRingTiles * kTile * sizeof(float) + kSignalWords * sizeof(uint64_t), &staging);
  if (rc != 0) return rc;
  float* ring = (float*)staging;                               // kRingTiles slots of kTile floats
  uint64_t* signals = (uint64_t*)(ring + kRingTiles * kTile);  // kSignalWords signal words
  // >>> COMMBENCH EDIT launch
  static int sms = 0;
  if (sms == 0) {
    // rank + 1's ring must be reachable by stores (NVLink peer-to-peer)
    if (nvshmem_ptr(ring, (ctx->rank + 1) % ctx->world_size) == nullptr) return 4;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 3;
  }
  const size_t tiles = (count + kTile - 1) / kTile;
  // P producers and P consumers, all resident at once (they spin on signals that peers' CTAs
  // set): at most one CTA per multiprocessor, and no more than there are slots
  int P = sms / 2 < kRingTiles ? sms / 2 : kRingTiles;
  if ((size_t)P > tiles) P = (int)tiles;
  if (P < 1) P = 1;
  static uint64_t base = 0;  // tiles streamed in earlier calls (the same on every rank)
  tile_pipeline<<<2 * P, kThreads, 0, stream>>>(x, out, ring, signals, count, tiles, P, base);
  base += tiles;
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
