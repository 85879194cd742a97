// EPLB rebalance over CUDA IPC: every rank fills its new expert slots by reading the weights
// from a replica in the old placement, straight from the peers' memory, with a ready and a
// done flag per pair of ranks in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (vLLM's EPLB moves weights with point-to-point transfers; here every rank pulls what
// its new slots need straight from the peers' memory):
//   1. a one-block kernel tells every peer "my call number `epoch` has begun: my old_weights
//      are this call's" (a release store into the peer's ready[rank]);
//   2. the copy kernel: block (slot, part) looks up the expert of its new slot, finds a
//      replica in the old placement (this rank's own slots first: a local copy; then the
//      peers from the next rank on, so the ranks spread their reads over the replicas),
//      waits (acquire) until that peer has said its call began, and copies its part of the
//      row. Only a block that reads a late peer waits for it;
//   3. a one-block kernel tells every peer "I have finished reading your old_weights" (the
//      copy kernel has ended before it starts, stream order), then waits until every peer
//      has said the same: when it ends no peer still reads this rank's old_weights, and the
//      caller may overwrite them.
// The ready and done kernels are separate launches so that no block of the copy grid ever
// waits for a block of a peer's grid that may not be resident yet. Rows start at s * H, which
// need not be 16-byte aligned: the floats before the destination's first 16-byte boundary
// and after its last whole vector go one by one; the source is read in whole vectors when it
// is aligned there too, float by float otherwise. The flag value is a call counter kept on
// the host: every rank makes the same calls, it grows every call, so a flag left by an
// earlier call never lets a wait through (a peer is never two calls ahead: its next call
// needs this rank's done).
constexpr int THREADS = 512;
constexpr int UNROLL = 4;          // 16-byte vectors in flight per thread
constexpr int MAX_SLOTS = 64;
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t ready[COMMBENCH_MAX_RANKS];  // [from rank]: its call has begun
  uint32_t done[COMMBENCH_MAX_RANKS];   // [from rank]: it no longer reads this rank's weights
};

struct Args {
  const float* src[COMMBENCH_MAX_RANKS];   // every rank's old_weights, mapped here
  Flags* peer_flags[COMMBENCH_MAX_RANKS];  // every rank's workspace, mapped here
  Flags* own_flags;
  float* dst;                              // own new_weights
  const int32_t* old_map;
  const int32_t* new_map;
  size_t hidden;                           // floats per expert
  int slots;
  int per_slot;                            // blocks per row
  int rank;
  int n;
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

__global__ void ready_kernel(const Args a) {
  const int j = threadIdx.x;
  if (j < a.n && j != a.rank) st_release_sys(&a.peer_flags[j]->ready[a.rank], a.epoch);
}

__global__ void done_kernel(const Args a) {
  const int j = threadIdx.x;
  if (j < a.n && j != a.rank) st_release_sys(&a.peer_flags[j]->done[a.rank], a.epoch);
  if (j < a.n && j != a.rank) wait_for(&a.own_flags->done[j], a.epoch);
}

// part `part` of `parts` of copying `count` floats from src to dst
__device__ __forceinline__ void copy_part(float* dst, const float* src, size_t count, int part,
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
  } else {  // the source is off by 4, 8 or 12 bytes: four loads per vector
    for (; i < vecs; i += stride) {
      const float* p = s + 4 * i;
      d[i] = make_float4(p[0], p[1], p[2], p[3]);
    }
  }
  // the head and tail floats, one thread each
  if (part == 0 && threadIdx.x < head) dst[threadIdx.x] = src[threadIdx.x];
  if (part == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    dst[t] = src[t];
  }
}

__global__ void __launch_bounds__(THREADS) copy_kernel(const Args a) {
  const int slot = blockIdx.x / a.per_slot;
  const int part = blockIdx.x % a.per_slot;
  __shared__ int from, row;
  if (threadIdx.x == 0) {
    const int expert = a.new_map[a.rank * a.slots + slot];
    const int physical = a.n * a.slots;
    from = -1;
    // this rank's own slots first, then the next ranks' in turn
    for (int k = 0; k < physical; ++k) {
      const int q = (a.rank * a.slots + k) % physical;
      if (a.old_map[q] == expert) {
        from = q / a.slots;
        row = q % a.slots;
        break;
      }
    }
    if (from < 0) __trap();  // the maps break their contract
    if (from != a.rank) wait_for(&a.own_flags->ready[from], a.epoch);  // its weights are this call's
  }
  __syncthreads();
  copy_part(a.dst + (size_t)slot * a.hidden, a.src[from] + (size_t)row * a.hidden, a.hidden,
            part, a.per_slot);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* old_weights = (const float*)ctx->buffers[0];  // S rows of H floats
  const int32_t* old_map = (const int32_t*)ctx->buffers[1];  // world_size * S experts, every rank alike
  const int32_t* new_map = (const int32_t*)ctx->buffers[2];  // world_size * S experts, every rank alike
  float* new_weights = (float*)ctx->buffers[3];              // S rows of H floats: the output
  const int64_t slots = ctx->params[0];                      // S
  const size_t hidden = ctx->buffer_bytes[0] / sizeof(float) / (size_t)slots;  // H
  // ctx->peer_buffers[r][0]: rank r's old_weights, mapped on this GPU
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  const int n = ctx->world_size;
  if (n < 1 || n > COMMBENCH_MAX_RANKS || slots < 1 || slots > MAX_SLOTS ||
      ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Flags))
    return 2;
  if (hidden == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;

  Args a = {};
  for (int r = 0; r < n; ++r) {
    a.src[r] = (const float*)ctx->peer_buffers[r][0];
    a.peer_flags[r] = (Flags*)ctx->peer_workspace[r];
  }
  a.src[ctx->rank] = old_weights;
  a.own_flags = (Flags*)ctx->workspace;
  a.dst = new_weights;
  a.old_map = old_map;
  a.new_map = new_map;
  a.hidden = hidden;
  a.slots = (int)slots;
  a.rank = ctx->rank;
  a.n = n;
  a.epoch = ++epoch;
  // UNROLL vectors per thread per row, at most about two blocks per SM over all rows
  size_t per = (hidden / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  const size_t most = (size_t)sms * 2 / (size_t)slots;
  if (per > most) per = most;
  if (per < 1) per = 1;
  a.per_slot = (int)per;

  ready_kernel<<<1, 32, 0, stream>>>(a);
  copy_kernel<<<(unsigned)(per * slots), THREADS, 0, stream>>>(a);
  done_kernel<<<1, 32, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
