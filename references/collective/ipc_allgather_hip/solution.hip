// Full-mesh all-gather over HIP IPC on AMD GPUs joined by xGMI: every rank's kernel stores its
// block straight into every rank's recvbuf, synchronizing with its peers through flags in an
// IPC-shared workspace.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a full mesh of memory channels, as MSCCL++'s all-gather, over xGMI):
//   1. start barrier: block b posts the call number `epoch` into start[b][rank] of every
//      peer's workspace (release, system scope) and waits (acquire, system scope) until every
//      peer has posted it here: from then on every peer's recvbuf is this call's and may be
//      written;
//   2. push: the block's threads load their share of sendbuf once and store it into this
//      rank's slot (floats rank * count ..) of every rank's recvbuf, its own included, so
//      all n-1 xGMI links carry a copy at the same time. The stores are 16 bytes wide with
//      UNROLL of them in flight per thread. The slot is aligned alike in every recvbuf (all
//      are 256-byte aligned), so the floats before its first 16-byte boundary (head) and after
//      its last one (tail) go one by one; the vectors in between are loaded whole when the
//      source is aligned there too, float by float (local loads, cheap) when it is not;
//   3. end barrier: every thread fences its pushes at system scope, then block b posts and
//      waits on the end flags: once block b of every peer has posted, its share is in this
//      rank's recvbuf, so the output is complete when the kernel ends, whatever the peers do
//      afterwards.
// Block b only pairs with block b of the peers: the grid depends on count, the CU count and the
// occupancy (never on this rank's alignment), so every rank launches the same one, and it is
// never larger than what the GPU keeps resident at once. The flags sit in the fine-grained
// workspace; their value is a host-side call counter that every rank advances alike, so a
// flag left by an earlier call never passes a later wait.
constexpr int MAX_RANKS = 8;      // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;  // flag slots per barrier
constexpr int THREADS = 512;      // eight wavefronts of 64 lanes on gfx942
constexpr int UNROLL = 4;         // 16-byte vectors in flight per thread

struct Flags {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Args {
  const float* src;          // this rank's sendbuf
  float* dst[MAX_RANKS];     // this rank's slot in every rank's recvbuf, opened here
  Flags* flags[MAX_RANKS];   // every rank's workspace, opened here (flags[rank]: its own)
  size_t count;
  int rank;
  uint32_t epoch;
};

__device__ __forceinline__ void post(uint32_t* flag, uint32_t value) {
  __hip_atomic_store(flag, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}

// spin until the flag holds this call's number (flags only grow)
__device__ __forceinline__ void wait_for(uint32_t* flag, uint32_t value) {
  while (__hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM) < value)
    __builtin_amdgcn_s_sleep(1);
}

// Handshake of block blockIdx.x with the same block of every peer: one lane per peer (all in
// the first wavefront) posts and waits. The first __syncthreads puts every wavefront's earlier
// stores before the release store; the second hands the acquired state to the whole block.
template <int N>
__device__ __forceinline__ void barrier(const Args& a, bool at_end) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < N && peer != a.rank) {
    Flags* theirs = a.flags[peer];
    Flags* mine = a.flags[a.rank];
    post(at_end ? &theirs->end[blockIdx.x][a.rank] : &theirs->start[blockIdx.x][a.rank], a.epoch);
    wait_for(at_end ? &mine->end[blockIdx.x][peer] : &mine->start[blockIdx.x][peer], a.epoch);
  }
  __syncthreads();
}

// vector i of the slot's aligned middle (it starts `head` floats into the slot), to every rank
template <int N>
__device__ __forceinline__ void push(const Args& a, size_t head, size_t i, const float4 v) {
#pragma unroll
  for (int r = 0; r < N; ++r) reinterpret_cast<float4*>(a.dst[r] + head)[i] = v;
}

template <int N>
__global__ void __launch_bounds__(THREADS) allgather_kernel(const Args a) {
  barrier<N>(a, false);

  // floats before the slot's first 16-byte boundary, whole vectors, floats after the last
  const size_t past = ((uintptr_t)a.dst[a.rank] & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > a.count) head = a.count;
  const size_t vecs = (a.count - head) / 4;
  const size_t tail = a.count - head - vecs * 4;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  if (head == 0) {  // sendbuf is 16-byte aligned where the vectors start
    const float4* src = reinterpret_cast<const float4*>(a.src);
    for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) push<N>(a, 0, i + u * stride, v[u]);
    }
    for (; i < vecs; i += stride) push<N>(a, 0, i, src[i]);
  } else {  // it is not: four float loads per vector
    const float* src = a.src + head;
    for (; i < vecs; i += stride) {
      const float* p = src + 4 * i;
      push<N>(a, head, i, make_float4(p[0], p[1], p[2], p[3]));
    }
  }
  // the head and tail floats, one thread each
  if (blockIdx.x == 0 && threadIdx.x < head) {
#pragma unroll
    for (int r = 0; r < N; ++r) a.dst[r][threadIdx.x] = a.src[threadIdx.x];
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
#pragma unroll
    for (int r = 0; r < N; ++r) a.dst[r][t] = a.src[t];
  }

  __threadfence_system();  // this thread's pushes across xGMI, before the block's end flag
  barrier<N>(a, true);
}

// UNROLL vectors per thread while the grid fits on the GPU at once (at most two blocks per CU,
// fewer where the occupancy says so); 0 on success.
template <int N>
static int launch(const Args& a, int cus, hipStream_t stream) {
  static int resident = 0;  // blocks of this kernel one CU holds at once
  if (!resident && hipOccupancyMaxActiveBlocksPerMultiprocessor(
                       &resident, allgather_kernel<N>, THREADS, 0) != hipSuccess)
    return 3;
  if (resident < 1) return 3;
  const size_t per_cu = resident < 2 ? (size_t)resident : 2;
  const size_t most = (size_t)cus * per_cu < (size_t)MAX_BLOCKS ? (size_t)cus * per_cu
                                                                 : (size_t)MAX_BLOCKS;
  size_t blocks = (a.count / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  if (blocks > most) blocks = most;
  if (blocks < 1) blocks = 1;
  hipLaunchKernelGGL(allgather_kernel<N>, dim3((unsigned)blocks), dim3(THREADS), 0, stream, a);
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's block: count floats
  float* recvbuf = (float*)ctx->buffers[1];              // every rank's block: n * count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, opened here through HIP IPC
  // ctx->workspace / ctx->peer_workspace[r]: fine-grained, zeroed once, kept across calls
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > MAX_RANKS || ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Flags))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int cus = 0;
  if (!cus && hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, ctx->device) !=
                  hipSuccess)
    return 3;

  Args a = {};
  a.src = sendbuf;
  for (int r = 0; r < n; ++r) {
    a.dst[r] = (float*)ctx->peer_buffers[r][1] + (size_t)ctx->rank * count;
    a.flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.dst[ctx->rank] = recvbuf + (size_t)ctx->rank * count;
  a.flags[ctx->rank] = (Flags*)ctx->workspace;
  a.count = count;
  a.rank = ctx->rank;
  a.epoch = ++epoch;

  int rc;
  switch (n) {
    case 1: rc = launch<1>(a, cus, stream); break;
    case 2: rc = launch<2>(a, cus, stream); break;
    case 3: rc = launch<3>(a, cus, stream); break;
    case 4: rc = launch<4>(a, cus, stream); break;
    case 5: rc = launch<5>(a, cus, stream); break;
    case 6: rc = launch<6>(a, cus, stream); break;
    case 7: rc = launch<7>(a, cus, stream); break;
    default: rc = launch<8>(a, cus, stream); break;
  }
  if (rc != 0) return rc;
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
