// Sum all-reduce from a kernel with NVSHMEM: the ranks' kernels reduce and exchange the data
// through the symmetric heap with puts and signals.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design. A reduce-scatter, then an all-gather, each one hop, through the symmetric heap.
// The data is split into world segments of `seg` floats (ceil(count / world) rounded up to 64:
// rank j owns [j * seg, min(count, (j + 1) * seg)), which is shorter or empty at the end), and
// each segment into chunks of `piece` floats (a multiple of 64); seg and piece come from count
// and world alone, so every rank cuts alike. Symmetric buffer: [flags | half 0 | half 1], call
// `epoch` (1, 2, ...) using half epoch & 1, a half being
//   inbox:  world slots of seg floats; slot s holds rank s's copy of this rank's segment;
//   result: world slots of seg floats; slot j holds owner j's reduced segment.
// CTA b handles the chunk indices c = b, b + grid, ...; for each, in three passes:
//   (1) reduce-scatter: put chunk c of segment j of sendbuf into inbox slot `rank` of every
//       rank j != rank (block-wide put-with-signal; signal rs[half][rank][c] := epoch on j);
//   (2) reduce: wait for rs[half][s][c] >= epoch from every s != rank, add this rank's own
//       chunk and the received ones in float32, and store the sum into recvbuf and into result
//       slot `rank` of every other rank (NVLink stores through nvshmem_ptr); then
//       ag[half][rank][c] := epoch on each of them;
//   (3) all-gather: for every owner j != rank, wait for ag[half][j][c] >= epoch and copy
//       result slot j's chunk into recvbuf.
// Every CTA makes all its puts of pass 1 before it waits for anything, so no CTA waits for
// work that a waiting CTA holds back.
// Across calls: signals hold epochs and each half has its own, so no later call's signal can
// stand for this call's data. A half is written again two calls later, and no rank can be two
// calls ahead of a peer whose memory it writes: a rank finishes call e + 1 only after the
// owner of every chunk it wrote in call e + 2 has sent its reduced chunk of call e + 1 (so the
// owner had finished call e and its reads of that inbox), and an owner reduces a chunk of call
// e + 2 only after it finished call e + 1, which needed every rank's piece of that chunk of
// call e + 1 (so that rank had finished call e and its reads of that result slot).
constexpr size_t kMaxCount = size_t(4) << 20;  // floats (16 MiB)
constexpr int kMaxWorld = COMMBENCH_MAX_RANKS;
constexpr int kMaxChunks = 32;    // chunks per segment
constexpr size_t kMinPiece = 4096;  // floats: 16 KiB
constexpr int kThreads = 512;
constexpr int kMaxCtas = 32;
constexpr int kUnroll = 4;
// world * seg <= count + 63 * world floats
constexpr size_t kArea = kMaxCount + 64 * kMaxWorld;

struct Flags {
  uint64_t rs[2][kMaxWorld][kMaxChunks];  // [half][source][chunk], set by the source
  uint64_t ag[2][kMaxWorld][kMaxChunks];  // [half][owner][chunk], set by the owner
};
constexpr size_t kFlagBytes = 32768;
static_assert(sizeof(Flags) <= kFlagBytes, "the flags fit in front of the halves");
constexpr size_t kSymBytes = kFlagBytes + 4 * kArea * sizeof(float);

// floats of chunk c of segment j (0 for the empty chunks at the end of the data)
__host__ __device__ __forceinline__ size_t chunk_len(size_t count, size_t seg, size_t piece,
                                                     int j, int c) {
  const size_t lo = (size_t)j * seg + (size_t)c * piece;
  size_t hi = (size_t)j * seg + seg;
  if (lo + piece < hi) hi = lo + piece;
  if (count < hi) hi = count;
  return hi > lo ? hi - lo : 0;
}

// dst[0 .. n) = src[0 .. n) by the whole CTA; src was written by a peer in this call, so it is
// read through L2 (ld.global.cg)
__device__ __forceinline__ void cta_copy_cg(float* __restrict__ dst,
                                            const float* __restrict__ src, size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t nv = n / 4;
    const float4* s = reinterpret_cast<const float4*>(src);
    float4* d = reinterpret_cast<float4*>(dst);
    size_t i = t;
    for (; i + (kUnroll - 1) * T < nv; i += kUnroll * T) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldcg(s + i + u * T);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * T] = v[u];
    }
    for (; i < nv; i += T) d[i] = __ldcg(s + i);
    for (size_t j = nv * 4 + t; j < n; j += T) dst[j] = __ldcg(src + j);
  } else {
    for (size_t j = t; j < n; j += T) dst[j] = __ldcg(src + j);
  }
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// sum = own[i] + in[s * seg + i] over every source s != rank, for i < n, by the whole CTA;
// stored into recv[i] and into out[j][i] for every peer j != rank
__device__ __forceinline__ void cta_reduce(float* __restrict__ recv,
                                           const float* __restrict__ own,
                                           const float* __restrict__ in, size_t seg,
                                           float* const* out, int rank, int world, size_t n) {
  const size_t t = threadIdx.x, T = blockDim.x;
  uintptr_t bits = reinterpret_cast<uintptr_t>(recv) | reinterpret_cast<uintptr_t>(own) |
                   reinterpret_cast<uintptr_t>(in) | (seg * sizeof(float));
  for (int j = 0; j < world; ++j)
    if (j != rank) bits |= reinterpret_cast<uintptr_t>(out[j]);
  size_t done = 0;
  if ((bits & 15) == 0) {
    const size_t nv = n / 4;
    for (size_t i = t; i < nv; i += T) {
      float4 acc = __ldg(reinterpret_cast<const float4*>(own) + i);
      for (int s = 0; s < world; ++s)
        if (s != rank) acc = add4(acc, __ldcg(reinterpret_cast<const float4*>(in + s * seg) + i));
      reinterpret_cast<float4*>(recv)[i] = acc;
      for (int j = 0; j < world; ++j)
        if (j != rank) reinterpret_cast<float4*>(out[j])[i] = acc;
    }
    done = nv * 4;
  }
  for (size_t i = done + t; i < n; i += T) {  // the last count % 4 elements (or all, unaligned)
    float acc = __ldg(own + i);
    for (int s = 0; s < world; ++s)
      if (s != rank) acc += __ldcg(in + s * seg + i);
    recv[i] = acc;
    for (int j = 0; j < world; ++j)
      if (j != rank) out[j][i] = acc;
  }
}

__global__ void __launch_bounds__(kThreads)
rs_ag_allreduce(const float* __restrict__ sendbuf, float* __restrict__ recvbuf, char* sym,
                size_t count, size_t seg, size_t piece, int chunks, uint64_t epoch) {
  Flags* flags = reinterpret_cast<Flags*>(sym);
  const int rank = nvshmem_my_pe(), world = nvshmem_n_pes();
  const int half = (int)(epoch & 1);
  const uint64_t flag = epoch;  // the value every signal of this call carries
  float* inbox = reinterpret_cast<float*>(sym + kFlagBytes) + (size_t)half * 2 * kArea;
  float* result = inbox + kArea;
  __shared__ float* out[kMaxWorld];  // result slot `rank` of every peer, for this CTA's chunk
  // (1) reduce-scatter: this rank's piece of every other rank's segment
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const size_t off = (size_t)c * piece;
    for (int k = 1; k < world; ++k) {
      const int j = (rank + k) % world;
      const size_t n = chunk_len(count, seg, piece, j, c);
      if (n == 0) continue;
      nvshmemx_putmem_signal_nbi_block(inbox + (size_t)rank * seg + off,
                                       sendbuf + (size_t)j * seg + off, n * sizeof(float),
                                       &flags->rs[half][rank][c], flag, NVSHMEM_SIGNAL_SET, j);
    }
  }
  // (2) reduce this rank's segment and push the sums to every other rank
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const size_t n = chunk_len(count, seg, piece, rank, c);
    if (n == 0) continue;
    const size_t off = (size_t)rank * seg + (size_t)c * piece;  // in the data and in a half
    if ((int)threadIdx.x < world)
      out[threadIdx.x] = static_cast<float*>(nvshmem_ptr(result + off, (int)threadIdx.x));
    if (threadIdx.x == 0) {
      for (int s = 0; s < world; ++s)
        if (s != rank) nvshmem_signal_wait_until(&flags->rs[half][s][c], NVSHMEM_CMP_GE, flag);
      __threadfence_system();  // the pieces are read only after their signals were seen
    }
    __syncthreads();
    cta_reduce(recvbuf + off, sendbuf + off, inbox + (size_t)c * piece, seg, out, rank, world,
               n);
    __syncthreads();  // every thread's stores of the sums are issued
    if (threadIdx.x == 0) {
      __threadfence_system();  // ... and visible to the peers before the signals
      for (int k = 1; k < world; ++k)
        nvshmemx_signal_op(&flags->ag[half][rank][c], flag, NVSHMEM_SIGNAL_SET,
                           (rank + k) % world);
    }
  }
  // (3) all-gather: every other owner's reduced chunk
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    for (int k = 1; k < world; ++k) {
      const int j = (rank + world - k) % world;
      const size_t n = chunk_len(count, seg, piece, j, c);
      if (n == 0) continue;
      const size_t off = (size_t)j * seg + (size_t)c * piece;
      if (threadIdx.x == 0) {
        nvshmem_signal_wait_until(&flags->ag[half][j][c], NVSHMEM_CMP_GE, flag);
        __threadfence_system();
      }
      __syncthreads();
      cta_copy_cg(recvbuf + off, result + off, n);
    }
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats: this rank's input
  float* recvbuf = (float*)ctx->buffers[1];               // count floats: the sum over ranks
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int world = ctx->world_size;
  if (world > kMaxWorld || count > kMaxCount) return 2;
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
  size_t seg = (count + world - 1) / world;
  seg = (seg + 63) / 64 * 64;
  size_t piece = (seg + kMaxChunks - 1) / kMaxChunks;
  piece = (piece + 63) / 64 * 64;
  if (piece < kMinPiece) piece = kMinPiece;
  const int chunks = (int)((seg + piece - 1) / piece);
  // all CTAs resident at once (a CTA spins on signals that peers' CTAs set): at most one CTA
  // per multiprocessor
  int grid = sms < kMaxCtas ? sms : kMaxCtas;
  if (grid > chunks) grid = chunks;
  if (grid < 1) grid = 1;
  static uint64_t epoch = 0;  // every rank makes the same calls
  ++epoch;
  rs_ag_allreduce<<<grid, kThreads, 0, stream>>>(sendbuf, recvbuf, (char*)sym, count, seg,
                                                 piece, chunks, epoch);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
