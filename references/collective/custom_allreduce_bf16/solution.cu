// Custom all-reduce of bfloat16 data over CUDA IPC, as vLLM's: a one-shot kernel for small
// messages and a two-shot (reduce-scatter + all-gather) kernel for large ones, summing in
// float32 and synchronizing through signal flags in an IPC-shared workspace.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (vLLM's custom all-reduce: signal flags per block, one stage or two):
//   - every kernel begins with a start barrier (block b of every rank tells block b of every
//     peer "my call number `epoch` has begun", so its sendbuf holds this call's input and its
//     recvbuf may be written, and waits for the same word from every peer) and ends with an
//     end barrier (block b waits until block b of every peer is done, so no rank leaves while
//     a peer still reads its sendbuf or writes its recvbuf, and this rank's recvbuf is
//     complete when its kernel ends);
//   - one-shot (count <= ONESHOT_MAX): each thread loads one 16-byte vector (8 bf16) from
//     every rank's sendbuf, all in flight at once, widens them to float32 (a bf16 is the top
//     half of a float32: exact), sums them in rank order, rounds once to bf16 (nearest, ties to
//     even) and stores into its own recvbuf;
//   - two-shot (larger): the vectors are split in n slices of ceil(vectors / n); rank r sums
//     slice r over every rank's sendbuf (UNROLL vectors per rank in flight) and stores the
//     rounded sum straight into slice r of every rank's recvbuf, its own and the peers'
//     (reduce-scatter by pulling, all-gather by pushing: the reduced slice never round-trips
//     through memory, so no barrier is needed between the two);
//   - the count % 8 elements past the last vector are summed by every rank for itself, in the
//     same order, in both.
// The barriers pair block b with block b only: every rank launches the same grid (from count,
// the slice length and the SM count), and the end barriers of all blocks together cover every
// peer block. The grids (at most 2 blocks of 512 threads per SM) are co-resident. The flag
// value is a call counter kept on the host: every rank makes the same calls, and it grows
// every call, so a flag left by an earlier call (either kernel, any grid) never passes.
constexpr int MAX_RANKS = 8;            // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;        // flag slots per barrier
constexpr int THREADS = 512;
constexpr size_t ONESHOT_MAX = 131072;  // elements (256 KiB): one-shot at and below
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Signals {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Args {
  const uint16_t* src[MAX_RANKS];  // every rank's sendbuf, mapped here
  uint16_t* dst[MAX_RANKS];        // every rank's recvbuf, mapped here
  Signals* peer_sig[MAX_RANKS];    // every rank's workspace, mapped here
  Signals* own_sig;
  size_t count;                    // elements
  size_t per;                      // two-shot: 16-byte vectors per slice, ceil(count / 8 / n)
  int rank;
  uint32_t epoch;
};

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// spin until the flag holds this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// Block-level barrier with block blockIdx.x of every other rank. The __syncthreads before
// orders every thread's earlier accesses before the release store (cumulativity); the one
// after hands the acquired state to the whole block.
template <int N>
__device__ __forceinline__ void barrier(const Args& a, bool at_end) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < N && peer != a.rank) {
    Signals* theirs = a.peer_sig[peer];
    uint32_t* out = at_end ? &theirs->end[blockIdx.x][a.rank] : &theirs->start[blockIdx.x][a.rank];
    const uint32_t* in = at_end ? &a.own_sig->end[blockIdx.x][peer]
                                : &a.own_sig->start[blockIdx.x][peer];
    st_release_sys(out, a.epoch);
    wait_for(in, a.epoch);
  }
  __syncthreads();
}

__device__ __forceinline__ float widen(uint32_t bits) { return __uint_as_float(bits << 16); }

// the float32 value of a bf16, rounded to the nearest bf16 (ties to even)
__device__ __forceinline__ uint32_t to_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// 8 bf16 of a 16-byte vector into float32 sums: element 2k is the low half of word k
__device__ __forceinline__ void first8(float (&s)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s[2 * k] = __uint_as_float(w[k] << 16);
    s[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

__device__ __forceinline__ void add8(float (&s)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s[2 * k] += __uint_as_float(w[k] << 16);
    s[2 * k + 1] += __uint_as_float(w[k] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack8(const float (&s)[8]) {
  uint4 o;
  o.x = to_bf16(s[0]) | (to_bf16(s[1]) << 16);
  o.y = to_bf16(s[2]) | (to_bf16(s[3]) << 16);
  o.z = to_bf16(s[4]) | (to_bf16(s[5]) << 16);
  o.w = to_bf16(s[6]) | (to_bf16(s[7]) << 16);
  return o;
}

// the count % 8 elements past the last vector, summed by every rank for its own recvbuf
template <int N>
__device__ __forceinline__ void tail_sum(const Args& a) {
  const size_t vecs = a.count / 8;
  const size_t tail = a.count - vecs * 8;
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x < tail) {
    const size_t t = vecs * 8 + threadIdx.x;
    float s = widen(a.src[0][t]);
#pragma unroll
    for (int r = 1; r < N; ++r) s += widen(a.src[r][t]);
    a.dst[a.rank][t] = (uint16_t)to_bf16(s);
  }
}

template <int N>
__global__ void __launch_bounds__(THREADS, 2) oneshot_kernel(const Args a) {
  barrier<N>(a, false);
  const size_t vecs = a.count / 8;
  const size_t stride = (size_t)gridDim.x * THREADS;
  uint4* out = reinterpret_cast<uint4*>(a.dst[a.rank]);
  for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < vecs; i += stride) {
    uint4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const uint4*>(a.src[r])[i];
    float s[8];
    first8(s, v[0]);
#pragma unroll
    for (int r = 1; r < N; ++r) add8(s, v[r]);
    out[i] = pack8(s);
  }
  tail_sum<N>(a);
  barrier<N>(a, true);
}

template <int N, int UNROLL>
__global__ void __launch_bounds__(THREADS, 2) twoshot_kernel(const Args a) {
  barrier<N>(a, false);
  const size_t vecs = a.count / 8;
  const size_t begin = (size_t)a.rank * a.per < vecs ? (size_t)a.rank * a.per : vecs;
  const size_t end = begin + a.per < vecs ? begin + a.per : vecs;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = begin + (size_t)blockIdx.x * THREADS + threadIdx.x;
  // UNROLL vectors per thread and rank in flight: all loads first, then the sums and stores
  for (; i + (UNROLL - 1) * stride < end; i += UNROLL * stride) {
    uint4 v[N][UNROLL];
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        v[r][u] = reinterpret_cast<const uint4*>(a.src[r])[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float s[8];
      first8(s, v[0][u]);
#pragma unroll
      for (int r = 1; r < N; ++r) add8(s, v[r][u]);
      const uint4 o = pack8(s);
#pragma unroll
      for (int r = 0; r < N; ++r) reinterpret_cast<uint4*>(a.dst[r])[i + u * stride] = o;
    }
  }
  for (; i < end; i += stride) {
    uint4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const uint4*>(a.src[r])[i];
    float s[8];
    first8(s, v[0]);
#pragma unroll
    for (int r = 1; r < N; ++r) add8(s, v[r]);
    const uint4 o = pack8(s);
#pragma unroll
    for (int r = 0; r < N; ++r) reinterpret_cast<uint4*>(a.dst[r])[i] = o;
  }
  tail_sum<N>(a);
  barrier<N>(a, true);
}

template <int N>
static void launch(const Args& a, int sms, cudaStream_t stream) {
  const size_t most = (size_t)sms * 2 < (size_t)MAX_BLOCKS ? (size_t)sms * 2 : (size_t)MAX_BLOCKS;
  size_t blocks;
  if (a.count <= ONESHOT_MAX) {
    // one vector per thread while that fits on the GPU at once (co-resident)
    blocks = (a.count / 8 + THREADS - 1) / THREADS;
    if (blocks > most) blocks = most;
    if (blocks < 1) blocks = 1;
    oneshot_kernel<N><<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  } else {
    constexpr int UNROLL = N <= 2 ? 4 : N <= 4 ? 2 : 1;
    // from `per`, the same on every rank, never from this rank's own (maybe shorter) slice
    blocks = (a.per + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
    if (blocks > most) blocks = most;
    if (blocks < 1) blocks = 1;
    twoshot_kernel<N, UNROLL><<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const uint16_t* sendbuf = (const uint16_t*)ctx->buffers[0];  // this rank's input: bf16 bits
  uint16_t* recvbuf = (uint16_t*)ctx->buffers[1];              // the sum: bf16 bits
  const size_t count = ctx->buffer_bytes[0] / sizeof(uint16_t);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Signals))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a = {};
  for (int r = 0; r < n; ++r) {
    a.src[r] = (const uint16_t*)ctx->peer_buffers[r][0];
    a.dst[r] = (uint16_t*)ctx->peer_buffers[r][1];
    a.peer_sig[r] = (Signals*)ctx->peer_workspace[r];
  }
  a.src[ctx->rank] = sendbuf;
  a.dst[ctx->rank] = recvbuf;
  a.own_sig = (Signals*)ctx->workspace;
  a.count = count;
  a.per = (count / 8 + n - 1) / n;
  a.rank = ctx->rank;
  a.epoch = ++epoch;

  switch (n) {
    case 1: launch<1>(a, sms, stream); break;
    case 2: launch<2>(a, sms, stream); break;
    case 3: launch<3>(a, sms, stream); break;
    case 4: launch<4>(a, sms, stream); break;
    case 5: launch<5>(a, sms, stream); break;
    case 6: launch<6>(a, sms, stream); break;
    case 7: launch<7>(a, sms, stream); break;
    default: launch<8>(a, sms, stream); break;
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
