// All-to-all over HIP IPC on AMD GPUs joined by xGMI: every rank's kernel stores each of its
// blocks straight into the recvbuf of the rank it is meant for, with a ready and a data flag
// per pair of ranks in an IPC-shared workspace.
#include <hip/hip_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a memory channel per pair of ranks and per thread block, as MSCCL++'s all-to-all,
// laid out for xGMI, where every pair of GPUs has a link of its own and one peer at a time
// would leave the other links idle: every rank pushes to all its peers at once):
//   the grid is n groups of `per` thread blocks. Group 0 copies this rank's own block locally.
//   Group k >= 1 serves one pair of ranks: it pushes to rank j = rank + k and receives from
//   rank i = rank - k (mod n), which is exactly the pair that block b of group k on rank j
//   pushes to and on rank i receives from, so flags pair block b with block b, and every
//   rank's group k sends to a different rank (a permutation: each link carries one stream
//   each way). Block b of a group k >= 1:
//   1. posts "my call number `epoch` has begun, write my recvbuf" into ready[b][rank] of rank
//      i's workspace (a release store at system scope);
//   2. waits (acquire, system scope) for ready[b][j] in its own workspace: j's call has begun;
//      then stores its share of sendbuf block j into block `rank` of j's recvbuf, fences its
//      stores at system scope and, after a block barrier, posts data[b][rank] into j's
//      workspace (release): a late peer holds up only the pushes to it;
//   3. waits for data[b][i] in its own workspace: i's share of this group is in recvbuf. The
//      waits of all blocks together cover every peer's every share, so this rank's output is
//      complete when its kernel ends, whatever its peers do afterwards.
// The copies store whole 16-byte vectors from the destination's first 16-byte boundary on
// (blocks start at i * count, which need not be aligned): the floats before it and after the
// last vector go one by one, and the source is loaded in whole vectors where it is aligned
// there too, float by float otherwise. The grid depends on count, n, the CU count and the
// occupancy only, so every rank launches the same one, and it never exceeds what the GPU keeps
// resident at once, so a spinning block never keeps the block it waits for off the GPU. The
// flags sit in the fine-grained workspace; their value is a host-side call counter that every
// rank advances alike, so a flag left by an earlier call (any size, any grid) never lets a
// wait through; a peer is never a call ahead on a flag, since its next push needs this rank's
// next ready.
constexpr int MAX_BLOCKS = 1024;  // flag slots per direction and peer
constexpr int THREADS = 512;      // eight wavefronts of 64 lanes on gfx942
constexpr int UNROLL = 4;         // 16-byte vectors in flight per thread

struct Flags {
  uint32_t ready[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]: its call has begun
  uint32_t data[MAX_BLOCKS][COMMBENCH_MAX_RANKS];   // [block][from rank]: its share is here
};

struct Args {
  const float* src;                    // this rank's sendbuf
  float* dst[COMMBENCH_MAX_RANKS];     // every rank's recvbuf, opened here
  Flags* flags[COMMBENCH_MAX_RANKS];   // every rank's workspace, opened here (flags[rank]: own)
  size_t count;                        // floats per block
  int rank;
  int n;
  int per;                             // thread blocks per group
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

// share `part` of `parts` of copying `count` floats from src to dst
__device__ __forceinline__ void copy_share(float* dst, const float* src, size_t count, int part,
                                           int parts) {
  const size_t past = ((uintptr_t)dst & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > count) head = count;
  const size_t vecs = (count - head) / 4;
  const size_t tail = count - head - vecs * 4;
  float4* d = reinterpret_cast<float4*>(dst + head);
  const float* s = src + head;
  const size_t stride = (size_t)parts * THREADS;
  size_t i = (size_t)part * THREADS + threadIdx.x;
  if (((uintptr_t)s & 15) == 0) {
    const float4* sv = reinterpret_cast<const float4*>(s);
    for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = sv[i + u * stride];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) d[i + u * stride] = v[u];
    }
    for (; i < vecs; i += stride) d[i] = sv[i];
  } else {  // the source is off by 4, 8 or 12 bytes: four float loads per vector
    for (; i < vecs; i += stride) {
      const float* p = s + 4 * i;
      d[i] = make_float4(p[0], p[1], p[2], p[3]);
    }
  }
  // the head and tail floats, one thread each, in the first part
  if (part == 0 && threadIdx.x < head) dst[threadIdx.x] = src[threadIdx.x];
  if (part == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    dst[t] = src[t];
  }
}

__global__ void __launch_bounds__(THREADS) alltoall_kernel(const Args a) {
  const int b = blockIdx.x;
  const int k = b / a.per;    // group: the distance to the peer pushed to
  const int part = b % a.per;
  const int me = a.rank;
  const size_t count = a.count;
  if (k == 0) {  // this rank's own block, locally
    copy_share(a.dst[me] + (size_t)me * count, a.src + (size_t)me * count, count, part, a.per);
    return;
  }
  const int j = (me + k) % a.n;         // pushed to
  const int i = (me - k + a.n) % a.n;   // received from
  if (threadIdx.x == 0) {
    post(&a.flags[i]->ready[b][me], a.epoch);  // i may write block i of this recvbuf
    wait_for(&a.flags[me]->ready[b][j], a.epoch);  // j's recvbuf is this call's too
  }
  __syncthreads();
  copy_share(a.dst[j] + (size_t)me * count, a.src + (size_t)j * count, count, part, a.per);
  __threadfence_system();  // this thread's pushes across xGMI, before the block's data flag
  __syncthreads();
  if (threadIdx.x == 0) {
    post(&a.flags[j]->data[b][me], a.epoch);
    wait_for(&a.flags[me]->data[b][i], a.epoch);  // i's share is in this recvbuf
  }
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // n blocks of count floats, block j for rank j
  float* recvbuf = (float*)ctx->buffers[1];              // n blocks of count floats, block i from rank i
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / (size_t)ctx->world_size;
  // ctx->peer_buffers[r][0] / [r][1]: rank r's sendbuf / recvbuf, opened here through HIP IPC
  // ctx->workspace / ctx->peer_workspace[r]: fine-grained, zeroed once, kept across calls
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > COMMBENCH_MAX_RANKS || ctx->workspace == nullptr ||
      ctx->workspace_bytes < sizeof(Flags))
    return 2;
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int cus = 0, resident = 0;
  if (!cus && hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, ctx->device) !=
                  hipSuccess)
    return 3;
  if (!resident && hipOccupancyMaxActiveBlocksPerMultiprocessor(&resident, alltoall_kernel,
                                                                THREADS, 0) != hipSuccess)
    return 3;
  if (resident < 1) return 3;

  Args a = {};
  a.src = sendbuf;
  for (int r = 0; r < n; ++r) {
    a.dst[r] = (float*)ctx->peer_buffers[r][1];
    a.flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.dst[ctx->rank] = recvbuf;
  a.flags[ctx->rank] = (Flags*)ctx->workspace;
  a.count = count;
  a.rank = ctx->rank;
  a.n = n;
  a.epoch = ++epoch;

  // per group: UNROLL vectors of a block per thread, while all n groups fit on the GPU at once
  // (at most two blocks per CU, fewer where the occupancy says so); from count, n, the CU count
  // and the occupancy only, so every rank launches the same grid
  const size_t per_cu = resident < 2 ? (size_t)resident : 2;
  size_t most = (size_t)cus * per_cu < (size_t)MAX_BLOCKS ? (size_t)cus * per_cu
                                                          : (size_t)MAX_BLOCKS;
  most /= (size_t)n;
  size_t per = (count / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  if (per > most) per = most;
  if (per < 1) per = 1;
  a.per = (int)per;
  hipLaunchKernelGGL(alltoall_kernel, dim3((unsigned)(per * (size_t)n)), dim3(THREADS), 0, stream,
                     a);
  return hipGetLastError() == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
