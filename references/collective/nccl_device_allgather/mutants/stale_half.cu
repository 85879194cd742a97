// All-gather with NCCL's device API: kernels store into the peers' symmetric windows (LSA).
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <string.h>

#include "commbench.h"

// ---- set-up given by the harness contract (not editable) --------------------------------
// The device communicator has kLsaBarriers LSA barriers (indices 0 .. kLsaBarriers-1 of
// dev.lsaBarrier), created on the first call. The symmetric window is memory from
// ncclMemAlloc registered with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) on every rank:
// same size everywhere, reachable from every rank's kernels through ncclGetLsaPointer. It is
// reallocated (contents undefined) only when a call asks for more bytes than it has, and keeps
// its contents from call to call otherwise.
constexpr int kLsaBarriers = 256;

struct NcclDeviceState {
  bool ready = false;
  ncclDevComm dev;
  ncclWindow_t win = nullptr;
  void* base = nullptr;
  size_t bytes = 0;
};
static NcclDeviceState g_nccl;

// Collective: every rank calls it in the same call with the same `bytes`. On success (0) *dev
// is the device communicator and *win a symmetric window of at least `bytes` bytes on every
// rank. Every rank must be load/store accessible (one NVLink domain; LSA rank == rank).
[[maybe_unused]] static int nccl_symmetric_window(const commbench_ctx* ctx, size_t bytes,
                                                  ncclDevComm* dev, ncclWindow_t* win) {
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  if (comm == nullptr) return 10;
  if (!g_nccl.ready) {
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
    ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs));
#endif
    reqs.lsaBarrierCount = kLsaBarriers;
    if (ncclDevCommCreate(comm, &reqs, &g_nccl.dev) != ncclSuccess) return 11;
    if (g_nccl.dev.lsaSize != ctx->world_size || g_nccl.dev.lsaRank != ctx->rank) return 12;
    g_nccl.ready = true;
  }
  if (bytes > g_nccl.bytes) {
    const size_t granule = size_t(2) << 20;
    const size_t want = (bytes + granule - 1) / granule * granule;
    if (cudaDeviceSynchronize() != cudaSuccess) return 13;
    if (g_nccl.win != nullptr) {
      if (ncclCommWindowDeregister(comm, g_nccl.win) != ncclSuccess) return 14;
      if (ncclMemFree(g_nccl.base) != ncclSuccess) return 15;
      g_nccl.win = nullptr;
      g_nccl.base = nullptr;
      g_nccl.bytes = 0;
    }
    if (ncclMemAlloc(&g_nccl.base, want) != ncclSuccess) return 16;
    if (ncclCommWindowRegister(comm, g_nccl.base, want, &g_nccl.win, NCCL_WIN_COLL_SYMMETRIC) !=
        ncclSuccess)
      return 17;
    g_nccl.bytes = want;
  }
  *dev = g_nccl.dev;
  *win = g_nccl.win;
  return 0;
}
// ------------------------------------------------------------------------------------------

// >>> COMMBENCH EDIT kernels
// mutant: collects from the other half of the window (the previous call's data): the parity
// is flipped between the pushing and the collecting side
// Design. Every rank's window holds two halves (calls alternate between them), each a copy of
// the gathered result: slot s (`stride` floats, 256-byte aligned) receives rank s's data.
// The count elements are cut into pieces of `piece` floats (a multiple of 4); CTA b handles
// pieces r * gridDim.x + b for rounds r = 0 .. rounds-1. For one piece a CTA
//   push:    reads its sendbuf once, stores it into slot `rank` of every peer's window over
//            NVLink (LSA pointers) and into its own recvbuf;
//   sync:    LSA barrier `blockIdx.x` with CTA b of every peer (release / acquire): CTA b of
//            every rank has then pushed the same piece to us;
//   collect: copies slots s != rank of its own window into recvbuf.
// The collect of round r-1 is issued right after the push of round r, so local copies overlap
// the NVLink traffic. Only CTA b of the peers writes what CTA b reads, so one barrier per CTA
// and round is all the synchronization there is.
// Across calls: call k+1 writes the other half, and a rank starts call k+2 only after its call
// k+1 synchronized with every peer's call k+1, which started after the peer's call k (that
// read this half) had finished: no barrier at kernel entry is needed.
constexpr int kThreads = 512;
constexpr int kUnroll = 4;
constexpr int kMaxWorld = COMMBENCH_MAX_RANKS;
constexpr size_t kMinCtaElems = 8192;  // at least 32 KiB of sendbuf per CTA
constexpr size_t kRoundElems = 32768;  // at least 128 KiB per CTA and round
constexpr size_t kMaxRounds = 4;

__host__ __device__ __forceinline__ size_t smin(size_t a, size_t b) { return a < b ? a : b; }

// Window data written by a peer during this kernel is read through L2 (ld.global.cg), never
// through the non-coherent read-only path; sendbuf is read-only for the whole kernel.
template <bool kPeerWritten, typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (kPeerWritten) return __ldcg(p);
  else return __ldg(p);
}

// dst[j] = src[j] for j < n by the whole CTA: 16-byte accesses when both are 16-byte aligned,
// 4-byte accesses otherwise (slots of recvbuf when count is not a multiple of 4).
template <bool kPeerWritten>
__device__ __forceinline__ void cta_copy(float* dst, const float* src, size_t n) {
  const int t = threadIdx.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t nv = n / 4;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    size_t i = t;
    for (; i + (kUnroll - 1) * kThreads < nv; i += kUnroll * kThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load<kPeerWritten>(s + i + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = v[u];
    }
    for (; i < nv; i += kThreads) d[i] = load<kPeerWritten>(s + i);
    for (size_t j = nv * 4 + t; j < n; j += kThreads) dst[j] = load<kPeerWritten>(src + j);
  } else {
    for (size_t j = t; j < n; j += kThreads) dst[j] = load<kPeerWritten>(src + j);
  }
}

// Elements [lo, hi) of sendbuf to slot `rank` of every peer's window (remote[p] is that slot
// in rank p's window) and to this rank's own slot of recvbuf (`mine`).
__device__ __forceinline__ void push_piece(float* const* remote, int rank, int world,
                                           const float* __restrict__ sendbuf, float* mine,
                                           size_t lo, size_t hi) {
  if (lo >= hi) return;
  const size_t n = hi - lo;
  const float* src = sendbuf + lo;  // 16-byte aligned: lo is a multiple of 4
  float* own = mine + lo;
  const bool own_vec = (reinterpret_cast<uintptr_t>(own) & 15) == 0;
  const size_t nv = n / 4;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* own4 = reinterpret_cast<uint4*>(own);
  size_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < nv; i += kUnroll * kThreads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(s + i + u * kThreads);
    for (int k = 1; k < world; ++k) {
      const int p = rank + k < world ? rank + k : rank + k - world;
      uint4* d = reinterpret_cast<uint4*>(remote[p] + lo);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = v[u];
    }
    if (own_vec) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) own4[i + u * kThreads] = v[u];
    }
  }
  for (; i < nv; i += kThreads) {
    const uint4 v = __ldg(s + i);
    for (int k = 1; k < world; ++k) {
      const int p = rank + k < world ? rank + k : rank + k - world;
      reinterpret_cast<uint4*>(remote[p] + lo)[i] = v;
    }
    if (own_vec) own4[i] = v;
  }
  // the last 0..3 elements of the data, and the own slot when it is not 16-byte aligned
  for (size_t j = nv * 4 + threadIdx.x; j < n; j += kThreads) {
    const float v = __ldg(src + j);
    for (int k = 1; k < world; ++k) {
      const int p = rank + k < world ? rank + k : rank + k - world;
      remote[p][lo + j] = v;
    }
    own[j] = v;
  }
  if (!own_vec) {
    for (size_t j = threadIdx.x; j < nv * 4; j += kThreads) own[j] = __ldg(src + j);
  }
}

__global__ void __launch_bounds__(kThreads)
allgather_lsa(ncclDevComm dev, ncclWindow_t win, const float* __restrict__ sendbuf,
              float* __restrict__ recvbuf, size_t count, size_t stride, size_t half,
              size_t piece, int rounds) {
  __shared__ float* remote[kMaxWorld];       // slot `rank` of this half in rank p's window
  __shared__ const float* local[kMaxWorld];  // slot p of this half in our own window
  const int rank = dev.rank, world = dev.nRanks;
  if (threadIdx.x < world) {
    const int p = threadIdx.x;
    remote[p] = (float*)ncclGetLsaPointer(win, half + (size_t)rank * stride * sizeof(float), p);
    // the half alternates between calls: flip it for the reading side
    const size_t read_half = half ? 0 : (size_t)world * stride * sizeof(float);
    local[p] =
        (const float*)ncclGetLsaPointer(win, read_half + (size_t)p * stride * sizeof(float), rank);
  }
  __syncthreads();
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dev, ncclTeamLsa(dev), dev.lsaBarrier,
                                         blockIdx.x};
  const size_t grid = gridDim.x;
  for (int r = 0; r <= rounds; ++r) {
    if (r < rounds) {
      const size_t lo = smin(count, ((size_t)r * grid + blockIdx.x) * piece);
      const size_t hi = smin(count, lo + piece);
      push_piece(remote, rank, world, sendbuf, recvbuf + (size_t)rank * count, lo, hi);
    }
    if (r > 0) {  // the piece of the previous round: every peer has pushed it (barrier r-1)
      const size_t lo = smin(count, ((size_t)(r - 1) * grid + blockIdx.x) * piece);
      const size_t hi = smin(count, lo + piece);
      for (int k = 1; k < world; ++k) {
        const int p = rank + k < world ? rank + k : rank + k - world;
        cta_copy<true>(recvbuf + (size_t)p * count + lo, local[p] + lo, hi - lo);
      }
    }
    if (r < rounds) bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats
  float* recvbuf = (float*)ctx->buffers[1];               // world_size * count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int world = ctx->world_size;
  if (world > kMaxWorld) return 2;
  const size_t stride = (count + 63) / 64 * 64;                // floats per slot (256 B aligned)
  const size_t half = (size_t)world * stride * sizeof(float);  // one gathered copy
  ncclDevComm dev;
  ncclWindow_t win;
  const int rc = nccl_symmetric_window(ctx, 2 * half, &dev, &win);
  if (rc != 0) return rc;
  static int sms = 0;
  if (sms == 0 &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;
  // one CTA per SM at most (all resident: CTA b waits for CTA b of the peers), one LSA barrier
  // per CTA; the same grid and rounds on every rank (same count, same GPUs)
  size_t grid = (count + kMinCtaElems - 1) / kMinCtaElems;
  grid = smin(grid, (size_t)(sms < kLsaBarriers ? sms : kLsaBarriers));
  if (grid == 0) grid = 1;
  size_t rounds = (count + grid * kRoundElems - 1) / (grid * kRoundElems);
  rounds = rounds < 1 ? 1 : smin(rounds, kMaxRounds);
  size_t piece = (count + grid * rounds - 1) / (grid * rounds);
  piece = (piece + 3) / 4 * 4;
  static unsigned long long calls = 0;  // the same sequence of calls on every rank
  const size_t half_off = (calls++ & 1) ? half : 0;
  allgather_lsa<<<(unsigned)grid, kThreads, 0, stream>>>(dev, win, sendbuf, recvbuf, count,
                                                          stride, half_off, piece, (int)rounds);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
