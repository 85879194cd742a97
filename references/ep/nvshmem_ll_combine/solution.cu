// MoE low-latency combine with NVSHMEM (DeepEP-style): every expert's output rows go back to
// the ranks that own their tokens, through a symmetric receive buffer with a signal per
// (expert, destination), and every rank sums its tokens' rows weighted by the router.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design (DeepEP's low-latency combine). The symmetric buffer:
//   sig[2][E]  u64: [parity][global expert e] = the epoch of the last call in which expert e's
//              rows for this rank arrived
//   two halves (calls alternate by the epoch's parity), each rows[E][T][H] float: slot (e, t)
//   holds expert e's output for this rank's token t.
// One kernel, every block resident (blocks wait for other GPUs):
//   1. send: block b takes the pairs (local expert j, home rank s) = b, b + grid, ...; the
//      pair's rows sit in y[j] after those of lower home ranks (recv_from gives the offsets);
//      its warps store each row (16-byte stores through NVLink) into slot (rank * L + j, t)
//      of rank s's current half, t = the row's recv_src. Then every thread fences at system
//      scope and one thread sets signal e on rank s to the epoch; every pair is signalled in
//      every call, also with no rows;
//   2. wait: every block waits for all E signals of this call addressed to this rank;
//   3. reduce: a warp per (token, 512-float chunk) sums w[t][k] * slot (topk_idx[t][k], t)
//      over the token's unmasked slots, in slot order, with fused multiply-adds in float32,
//      and stores the chunk of out (zero for a token routed nowhere).
// Across calls: the epoch grows by one per call, so a signal left by an earlier call never
// passes. A rank writes half (k & 1) in call k; it can only be one call ahead of any peer (its
// call k+1 waits for that peer's signals of call k+1, sent after the peer finished reading
// call k), so call k+2, the next writer of a half, never overwrites what a peer still reads.
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;
constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int UNROLL = 4;
constexpr int CHUNK = 32 * UNROLL;  // 16-byte vectors per chunk of a row
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

__host__ __device__ __forceinline__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct Args {
  const float4* y;
  const int* recv_src;
  const int* recv_from;
  const long long* topk_idx;
  const float* topk_weights;
  float4* out;
  int T, hv, topk, L, world, rank;
  char* sym;                // this PE's symmetric buffer
  char* peer[MAX_RANKS];    // every PE's symmetric buffer as a load/store pointer here
  size_t sig_bytes;         // the signals, then the halves
  size_t half_bytes;
  uint32_t epoch;
};

__device__ __forceinline__ unsigned long long ld_acquire_sys64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin until the signal reaches `epoch`
__device__ void wait_signal(const uint64_t* sig, uint32_t epoch) {
  const unsigned long long* p = reinterpret_cast<const unsigned long long*>(sig);
  const uint64_t start = now_ns();
  while (ld_acquire_sys64(p) < (unsigned long long)epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// a warp copies n 16-byte vectors (from a read-only input)
__device__ __forceinline__ void warp_copy(float4* dst, const float4* src, int n, int lane) {
  for (int v = lane; v < n; v += 32 * UNROLL) {
    float4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * 32 < n) r[u] = __ldg(src + v + u * 32);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * 32 < n) dst[v + u * 32] = r[u];
  }
}

__device__ __forceinline__ float4 fma4(float w, float4 v, float4 acc) {
  return make_float4(fmaf(w, v.x, acc.x), fmaf(w, v.y, acc.y), fmaf(w, v.z, acc.z),
                     fmaf(w, v.w, acc.w));
}

__global__ void __launch_bounds__(THREADS) ll_combine(Args a) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int experts = a.L * a.world;
  const size_t half = a.sig_bytes + ((a.epoch & 1) ? a.half_bytes : 0);
  uint64_t* sig = reinterpret_cast<uint64_t*>(a.sym) + (size_t)(a.epoch & 1) * experts;
  const size_t per_expert = (size_t)a.world * a.T;  // rows of one local expert in y

  // 1. send (the loop bounds are the same for the whole block: the barriers are safe)
  for (int p = blockIdx.x; p < experts; p += gridDim.x) {
    const int j = p / a.world, s = p % a.world;
    const int e = a.rank * a.L + j;
    int start = 0;  // rows of lower home ranks come first in y[j]
    for (int q = 0; q < s; ++q) start += __ldg(a.recv_from + (size_t)j * a.world + q);
    const int rows = __ldg(a.recv_from + p);
    const float4* src = a.y + ((size_t)j * per_expert + start) * a.hv;
    const int* toks = a.recv_src + (size_t)j * per_expert + start;
    float4* dst = reinterpret_cast<float4*>(a.peer[s] + half) + (size_t)e * a.T * a.hv;
    for (int i = warp; i < rows; i += WARPS)
      warp_copy(dst + (size_t)__ldg(toks + i) * a.hv, src + (size_t)i * a.hv, a.hv, lane);
    __threadfence_system();  // this thread's rows, visible to every GPU
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      nvshmemx_signal_op(sig + e, (uint64_t)a.epoch, NVSHMEM_SIGNAL_SET, s);
    }
  }

  // 2. every expert's rows for this rank, of this call
  for (int e = tid; e < experts; e += THREADS) wait_signal(sig + e, a.epoch);
  __syncthreads();

  // 3. reduce; slots written by peers are read through L2 (ld.global.cg)
  const float4* slots = reinterpret_cast<const float4*>(a.sym + half);
  const int chunks = (a.hv + CHUNK - 1) / CHUNK;
  const long long items = (long long)a.T * chunks;
  for (long long it = (long long)blockIdx.x * WARPS + warp; it < items;
       it += (long long)gridDim.x * WARPS) {
    const int t = (int)(it / chunks), c = (int)(it % chunks);
    const int off = c * CHUNK + lane;
    const int left = a.hv - off;  // vectors of this chunk at or after this lane's first
    float4 acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < a.topk; ++k) {
      const long long e = __ldg(a.topk_idx + (size_t)t * a.topk + k);
      if (e < 0) continue;  // a masked slot (the same for the whole warp)
      const float w = __ldg(a.topk_weights + (size_t)t * a.topk + k);
      const float4* r = slots + ((size_t)e * a.T + t) * a.hv + off;
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (u * 32 < left) v[u] = __ldcg(r + u * 32);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (u * 32 < left) acc[u] = fma4(w, v[u], acc[u]);
    }
    float4* dst = a.out + (size_t)t * a.hv + off;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (u * 32 < left) dst[u * 32] = acc[u];
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: y, recv_src, recv_from, topk_idx, topk_weights, out;
  // params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  const int64_t L = num_experts / world;  // experts per rank: global expert rank * L + j is local j
  // shapes (the same on every rank): T tokens per rank, H floats per token, topk experts each
  const int64_t T = num_experts > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int32_t) * (size_t)num_experts)) : 0;
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[5] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[3] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* y = (const float*)ctx->buffers[0];                 // (L, world*T, H) expert outputs
  const int32_t* recv_src = (const int32_t*)ctx->buffers[1];      // (L, world*T)
  const int32_t* recv_from = (const int32_t*)ctx->buffers[2];     // (L, world)
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[3];      // (T, topk) own tokens; -1: masked
  const float* topk_weights = (const float*)ctx->buffers[4];      // (T, topk)
  float* out = (float*)ctx->buffers[5];                           // (T, H)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || num_experts < world || num_experts % world ||
      T < 1 || T > (1 << 20) || H < 4 || H % 4 || topk < 1)
    return 2;
  Args a;
  a.y = (const float4*)y;
  a.recv_src = recv_src;
  a.recv_from = recv_from;
  a.topk_idx = (const long long*)topk_idx;
  a.topk_weights = topk_weights;
  a.out = (float4*)out;
  a.T = (int)T;
  a.hv = (int)(H / 4);
  a.topk = (int)topk;
  a.L = (int)L;
  a.world = world;
  a.rank = rank;
  a.sig_bytes = align256((size_t)2 * num_experts * sizeof(uint64_t));
  a.half_bytes = align256((size_t)num_experts * T * H * sizeof(float));
  void* sym = nullptr;
  const int rc = nvshmem_symmetric_buffer(ctx, a.sig_bytes + 2 * a.half_bytes, &sym);
  if (rc != 0) return rc;
  a.sym = (char*)sym;
  for (int p = 0; p < MAX_RANKS; ++p) a.peer[p] = nullptr;
  for (int p = 0; p < world; ++p) {  // every PE must be reachable by loads and stores (NVLink)
    a.peer[p] = (char*)nvshmem_ptr(sym, p);
    if (a.peer[p] == nullptr) return 4;
  }
  static int sms = 0, per_sm = 0;
  if (!sms) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ll_combine, THREADS, 0) != cudaSuccess)
      return 3;
  }
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  a.epoch = ++epoch;
  // a block per (expert, home rank) pair at least, the SMs' worth for the reduction, and never
  // more than can be resident at once (blocks wait for other GPUs)
  long long grid = num_experts > sms ? num_experts : sms;
  const long long resident = (long long)sms * (per_sm > 0 ? per_sm : 1);
  if (grid > resident) grid = resident;
  ll_combine<<<(unsigned)grid, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
