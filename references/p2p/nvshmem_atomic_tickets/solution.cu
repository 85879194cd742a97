// Tickets from one counter on PE 0: every item of every rank reserves a range of consecutive
// tickets with NVSHMEM atomics, from a kernel.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design. Symmetric buffer (the same few bytes every call): on PE 0 two ticket counters, call
// `epoch` (1, 2, ...) taking from counter[epoch & 1]; on every PE the signals done[s] = the last
// call whose tickets PE s has all taken (every PE tells PE 0, PE 0 tells every PE).
// A call: (1) a gate: PE 0 waits until every PE is done with the previous call, any other PE
// until PE 0 is; (2) PE 0 sets counter[(epoch + 1) & 1], the next call's, to zero: its last
// takers (the previous call's) are all done, and its next takers wait for PE 0's done of this
// call; (3) tickets are taken a tile of kTileItems items at a time: a block-wide exclusive
// scan of the items' `want`, one fetch-and-add of the tile's total on PE 0's counter, and each
// item's range placed at the tile's base plus its prefix; (4) the CTA that finishes last tells
// the others (done = epoch). So this call's counter was zeroed in the previous call, before
// PE 0's done that every taker of this call waited for.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 8;
constexpr int kTileItems = kThreads * kPerThread;
constexpr int kMaxCtas = 32;
constexpr int kMaxWorld = COMMBENCH_MAX_RANKS;

struct State {
  uint64_t counter[2];       // used on PE 0 only
  uint64_t done[kMaxWorld];  // done[s]: the last call whose tickets PE s has all taken
  unsigned int ctas_done;    // CTAs of the current call that are done (local)
};

// exclusive prefix of v over the CTA (thread order), and the CTA's total in *total
__device__ __forceinline__ int cta_exclusive_scan(int v, int* total) {
  __shared__ int warp_sums[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int s = lane < kWarps ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    if (lane < kWarps) warp_sums[lane] = s;  // inclusive prefix of the warps' totals
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
  *total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is written again by the next scan
  return before;
}

__global__ void __launch_bounds__(kThreads)
take_tickets(const int32_t* __restrict__ want, int64_t* __restrict__ first, char* sym,
             size_t count, uint64_t epoch) {
  State* st = reinterpret_cast<State*>(sym);
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  __shared__ unsigned long long tile_base;
  if (threadIdx.x == 0) {
    if (epoch > 1) {  // the gate: the previous call's takers are done
      if (rank == 0) {
        for (int s = 0; s < world; ++s)
          nvshmem_signal_wait_until(&st->done[s], NVSHMEM_CMP_GE, epoch - 1);
      } else {
        nvshmem_signal_wait_until(&st->done[0], NVSHMEM_CMP_GE, epoch - 1);
      }
      __threadfence_system();
    }
    if (rank == 0 && blockIdx.x == 0) {
      // the next call's counter: nobody takes from it before PE 0's done of this call
      nvshmem_uint64_atomic_set(&st->counter[(epoch + 1) & 1], 0, 0);
    }
  }
  __syncthreads();
  uint64_t* counter = &st->counter[epoch & 1];
  const size_t tiles = (count + kTileItems - 1) / kTileItems;
  for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const size_t lo = tile * kTileItems + threadIdx.x;  // this thread's items: lo + u * kThreads
    int w[kPerThread];
    int mine = 0;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const size_t i = lo + (size_t)u * kThreads;
      w[u] = i < count ? want[i] : 0;
      mine += w[u];
    }
    int total;
    const int before = cta_exclusive_scan(mine, &total);
    if (threadIdx.x == 0)
      tile_base = nvshmem_uint64_atomic_fetch_add(counter, (uint64_t)total, 0);
    __syncthreads();
    int64_t next = (int64_t)tile_base + before;
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const size_t i = lo + (size_t)u * kThreads;
      if (i < count) first[i] = next;
      next += w[u];
    }
  }
  __syncthreads();  // every ticket of this CTA is taken (fetch-and-adds return when done)
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&st->ctas_done, 1u) == gridDim.x - 1) {
      st->ctas_done = 0;  // the next call's kernel starts after this one ends
      __threadfence_system();
      if (rank == 0) {
        for (int p = 0; p < world; ++p)
          nvshmemx_signal_op(&st->done[0], epoch, NVSHMEM_SIGNAL_SET, p);
      } else {
        nvshmemx_signal_op(&st->done[rank], epoch, NVSHMEM_SIGNAL_SET, 0);
      }
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int32_t* want = (const int32_t*)ctx->buffers[0];  // count items: tickets each needs
  int64_t* first = (int64_t*)ctx->buffers[1];              // count items: first ticket of each
  const size_t count = ctx->buffer_bytes[0] / sizeof(int32_t);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (ctx->world_size > kMaxWorld) return 2;
  void* sym = nullptr;
  // the same size in every call: allocated (zero-filled) once, in the first call
  const int rc = nvshmem_symmetric_buffer(ctx, sizeof(State), &sym);
  if (rc != 0) return rc;
  static int sms = 0;
  if (sms == 0) {
    if (nvshmem_ptr(sym, 0) == nullptr) return 4;  // PE 0's counter by NVLink atomics
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 3;
  }
  size_t grid = (count + kTileItems - 1) / kTileItems;
  const size_t most = sms < kMaxCtas ? (size_t)sms : (size_t)kMaxCtas;
  if (grid > most) grid = most;
  if (grid < 1) grid = 1;
  static uint64_t epoch = 0;  // every rank makes the same calls
  ++epoch;
  take_tickets<<<(unsigned)grid, kThreads, 0, stream>>>(want, first, (char*)sym, count, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
