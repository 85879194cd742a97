// MoE low-latency dispatch with NVSHMEM (DeepEP-style): every rank sends each token to the
// rank of each of its experts, into that expert's region of a symmetric receive buffer, and
// signals per (expert, source) how many tokens it sent; every rank then packs what its
// experts received.
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <stdlib.h>

#include "commbench.h"

// the harness's NVSHMEM set-up: nvshmem_symmetric_buffer() (see commbench_nvshmem.h)
#include "commbench_nvshmem.h"

// >>> COMMBENCH EDIT kernels
// Design (DeepEP's low-latency dispatch, with a deterministic order). The symmetric buffer:
//   sig[2][L][world]  u64: [parity][local expert j][source s] = epoch << 32 | count
//   two halves (calls alternate by the epoch's parity), each: src[L * world][T] int32, then
//   rows[L * world][T][H] float; region j * world + s of a half is (local expert j, source s),
//   T slots of one token each (a source sends one expert at most T tokens).
// One kernel, every block resident (blocks wait for other blocks and other GPUs):
//   1. send: block b takes global experts e = b, b + grid, ...; it scans the tokens a tile at
//      a time (a thread per token; a block-wide scan of "token names e" gives each such token
//      its slot, so slots follow token order) and its warps store the rows (16-byte stores
//      through NVLink) and token indices into region (e % L) * world + rank of rank e / L's
//      current half. Then every thread fences at system scope and one thread sets the
//      (expert, source) signal to epoch << 32 | count: the count arrives after the data.
//      Every (expert, source) pair is signalled in every call, also with a count of 0;
//   2. receive: every block waits for all L * world signals of this call addressed to this
//      rank, scans the counts (by expert, then source: the packed order) and its warps copy
//      rows into recv_x (the first pair with room: a binary search over the prefix); block 0
//      writes recv_count and recv_from.
// Across calls: the epoch grows by one per call, so a signal left by an earlier call never
// passes. A rank writes half (k & 1) in call k; it can only be one call ahead of any peer (its
// call k+1 waits for that peer's signals of call k+1, sent after the peer finished reading
// call k), so call k+2, the next writer of a half, never overwrites what a peer still reads.
constexpr int MAX_RANKS = COMMBENCH_MAX_RANKS;
constexpr int MAX_EXPERTS = 1024;
constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int UNROLL = 4;
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

__host__ __device__ __forceinline__ size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct Args {
  const float4* x;
  const long long* topk_idx;
  int T, hv, topk, L, world, rank;
  char* sym;                // this PE's symmetric buffer
  char* peer[MAX_RANKS];    // every PE's symmetric buffer as a load/store pointer here
  size_t sig_bytes;         // the signals, then the halves
  size_t src_bytes;         // the token indices at the start of a half, then the rows
  size_t half_bytes;
  float4* recv_x;
  int* recv_src;
  int* recv_count;
  int* recv_from;
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

// spin until the signal's epoch reaches `epoch`; returns its count
__device__ int wait_count(const uint64_t* sig, uint32_t epoch) {
  const unsigned long long* p = reinterpret_cast<const unsigned long long*>(sig);
  unsigned long long v = ld_acquire_sys64(p);
  const uint64_t start = now_ns();
  while ((uint32_t)(v >> 32) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
    v = ld_acquire_sys64(p);
  }
  return (int)(uint32_t)v;
}

// a warp copies n 16-byte vectors; rows a peer wrote are read through L2 (ld.global.cg)
template <bool kPeerWritten>
__device__ __forceinline__ void warp_copy(float4* dst, const float4* src, int n, int lane) {
  for (int v = lane; v < n; v += 32 * UNROLL) {
    float4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * 32 < n) r[u] = kPeerWritten ? __ldcg(src + v + u * 32) : __ldg(src + v + u * 32);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (v + u * 32 < n) dst[v + u * 32] = r[u];
  }
}

__global__ void __launch_bounds__(THREADS) ll_dispatch(Args a) {
  __shared__ int list[THREADS];          // a tile's tokens for the expert, in order
  __shared__ int warp_cnt[WARPS];
  __shared__ int pre[MAX_EXPERTS + 1];   // counts, then their exclusive prefix over (j, s)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pairs = a.L * a.world;
  const size_t half = a.sig_bytes + ((a.epoch & 1) ? a.half_bytes : 0);
  uint64_t* sig = reinterpret_cast<uint64_t*>(a.sym) + (size_t)(a.epoch & 1) * pairs;

  // 1. send (the loop bounds are the same for the whole block: the barriers are safe)
  for (int e = blockIdx.x; e < pairs; e += gridDim.x) {
    const int dst = e / a.L, j = e % a.L;
    const size_t region = (size_t)j * a.world + a.rank;
    int* dst_src = reinterpret_cast<int*>(a.peer[dst] + half) + region * a.T;
    float4* dst_rows = reinterpret_cast<float4*>(a.peer[dst] + half + a.src_bytes) +
                       region * a.T * a.hv;
    int count = 0;
    for (int first = 0; first < a.T; first += THREADS) {
      const int t = first + tid;
      bool hit = false;
      if (t < a.T) {
        const long long* idx = a.topk_idx + (size_t)t * a.topk;
        for (int k = 0; k < a.topk; ++k) hit |= __ldg(idx + k) == (long long)e;
      }
      const uint32_t ballot = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) warp_cnt[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, n = 0;
      for (int w = 0; w < WARPS; ++w) {
        const int c = warp_cnt[w];
        before += w < warp ? c : 0;
        n += c;
      }
      if (hit) list[before + __popc(ballot & ((1u << lane) - 1u))] = t;
      __syncthreads();
      for (int i = warp; i < n; i += WARPS) {
        const int tok = list[i];
        warp_copy<false>(dst_rows + (size_t)(count + i) * a.hv, a.x + (size_t)tok * a.hv, a.hv, lane);
        if (lane == 0) dst_src[count + i] = tok;
      }
      count += n;
      __syncthreads();  // list and warp_cnt are reused by the next tile
    }
    __threadfence_system();  // this thread's rows and indices, visible to every GPU
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      nvshmemx_signal_op(sig + region, ((uint64_t)a.epoch << 32) | (uint32_t)count,
                         NVSHMEM_SIGNAL_SET, dst);
    }
  }

  // 2. receive: every (local expert, source) count of this call, then its exclusive prefix
  for (int i = tid; i < pairs; i += THREADS) pre[i] = wait_count(sig + i, a.epoch);
  __syncthreads();
  if (warp == 0) {  // one warp scans: lane l takes a run of consecutive pairs
    const int per = (pairs + 31) / 32;
    const int lo = lane * per, hi = min(pairs, lo + per);
    int sum = 0;
    for (int i = lo; i < hi; ++i) sum += pre[i];
    int incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    int run = incl - sum;
    for (int i = lo; i < hi; ++i) {
      const int c = pre[i];
      pre[i] = run;
      run += c;
    }
    if (lane == 31) pre[pairs] = incl;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int i = tid; i < pairs; i += THREADS) a.recv_from[i] = pre[i + 1] - pre[i];
    for (int j = tid; j < a.L; j += THREADS)
      a.recv_count[j] = pre[(j + 1) * a.world] - pre[j * a.world];
  }
  const int total = pre[pairs];
  const float4* rows = reinterpret_cast<const float4*>(a.sym + half + a.src_bytes);
  const int* srcs = reinterpret_cast<const int*>(a.sym + half);
  const size_t per_expert = (size_t)a.world * a.T;  // rows of one expert in recv_x
  for (int q = blockIdx.x * WARPS + warp; q < total; q += gridDim.x * WARPS) {
    int lo = 0, hi = pairs;  // the last pair p with pre[p] <= q: pre[lo] <= q < pre[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (pre[mid] <= q) lo = mid;
      else hi = mid;
    }
    const int p = lo, j = p / a.world;
    const int i = q - pre[p];             // the slot in region p
    const int o = q - pre[j * a.world];   // the row in expert j's output
    warp_copy<true>(a.recv_x + ((size_t)j * per_expert + o) * a.hv,
                    rows + ((size_t)p * a.T + i) * a.hv, a.hv, lane);
    if (lane == 0) a.recv_src[(size_t)j * per_expert + o] = __ldcg(srcs + (size_t)p * a.T + i);
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  // buffers, in this order: x, topk_idx, recv_x, recv_src, recv_count, recv_from;
  // params: num_experts
  const int world = ctx->world_size;
  const int rank = ctx->rank;
  const int64_t num_experts = ctx->params[0];
  const int64_t L = num_experts / world;  // experts per rank: global expert rank * L + j is local j
  // shapes (the same on every rank): T tokens per rank, H floats per token, topk experts each
  const int64_t T = num_experts > 0 ? (int64_t)(ctx->buffer_bytes[3] / (sizeof(int32_t) * (size_t)num_experts)) : 0;
  const int64_t H = T > 0 ? (int64_t)(ctx->buffer_bytes[0] / (sizeof(float) * (size_t)T)) : 0;
  const int64_t topk = T > 0 ? (int64_t)(ctx->buffer_bytes[1] / (sizeof(int64_t) * (size_t)T)) : 0;
  const float* x = (const float*)ctx->buffers[0];             // (T, H) this rank's tokens
  const int64_t* topk_idx = (const int64_t*)ctx->buffers[1];  // (T, topk); -1: a masked slot
  float* recv_x = (float*)ctx->buffers[2];                    // (L, world*T, H)
  int32_t* recv_src = (int32_t*)ctx->buffers[3];              // (L, world*T)
  int32_t* recv_count = (int32_t*)ctx->buffers[4];            // (L,)
  int32_t* recv_from = (int32_t*)ctx->buffers[5];             // (L, world)
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (world < 1 || world > MAX_RANKS || num_experts < world || num_experts % world ||
      num_experts > MAX_EXPERTS || T < 1 || T > (1 << 20) || H < 4 || H % 4 || topk < 1)
    return 2;
  Args a;
  a.x = (const float4*)x;
  a.topk_idx = (const long long*)topk_idx;
  a.T = (int)T;
  a.hv = (int)(H / 4);
  a.topk = (int)topk;
  a.L = (int)L;
  a.world = world;
  a.rank = rank;
  a.sig_bytes = align256((size_t)2 * num_experts * sizeof(uint64_t));
  a.src_bytes = align256((size_t)num_experts * T * sizeof(int));
  a.half_bytes = a.src_bytes + (size_t)num_experts * T * H * sizeof(float);
  void* sym = nullptr;
  const int rc = nvshmem_symmetric_buffer(ctx, a.sig_bytes + 2 * a.half_bytes, &sym);
  if (rc != 0) return rc;
  a.sym = (char*)sym;
  for (int p = 0; p < MAX_RANKS; ++p) a.peer[p] = nullptr;
  for (int p = 0; p < world; ++p) {  // every PE must be reachable by loads and stores (NVLink)
    a.peer[p] = (char*)nvshmem_ptr(sym, p);
    if (a.peer[p] == nullptr) return 4;
  }
  a.recv_x = (float4*)recv_x;
  a.recv_src = recv_src;
  a.recv_count = recv_count;
  a.recv_from = recv_from;
  static int sms = 0, per_sm = 0;
  if (!sms) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ll_dispatch, THREADS, 0) != cudaSuccess)
      return 3;
  }
  static uint32_t epoch = 0;  // calls so far: the same on every rank
  a.epoch = ++epoch;
  // a block per expert at least, the SMs' worth for the copies, and never more than can be
  // resident at once (blocks wait for other blocks); the same grid on every rank
  long long grid = num_experts > sms ? num_experts : sms;
  const long long resident = (long long)sms * (per_sm > 0 ? per_sm : 1);
  if (grid > resident) grid = resident;
  ll_dispatch<<<(unsigned)grid, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
