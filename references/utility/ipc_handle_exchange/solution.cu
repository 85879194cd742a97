// CUDA IPC connection set-up, then a ring shift: every rank writes its sendbuf into its right
// neighbour's recvbuf, through a mapping of that buffer it opened itself.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design.
// Connections. In the first call (a set-up call) every rank allocates a small flag area of
// its own, zeroes it (finished before any peer can know of it), exports it and exchanges the
// handle through the host allgather; every rank maps the flags of its two neighbours once and
// keeps them for the run. In every set-up call (the first call on new buffers) every rank also
// exports its recvbuf and maps its right neighbour's, kept in a cache keyed by this rank's own
// recvbuf (the buffer set it belongs to); a set-up call that follows an ordinary call starts a
// new generation of buffers, so every mapping of the old ones is closed there, and a mapping
// kept under the same key is replaced. An ordinary call finds its mapping in the cache.
// Transfer. One kernel per call: every block (1) tells the left neighbour "my recvbuf is ready
// for call e" (this rank's call began, so the harness has poisoned it) and waits until the
// right neighbour has said the same; (2) copies its part of sendbuf into the right
// neighbour's recvbuf (16-byte vectors and a tail); (3) adds one to the right neighbour's
// arrival counter (after a system fence). Block 0 then waits until its own arrival counter
// has reached every block the left neighbour pushed in all calls so far, so this rank's
// device is idle only once its recvbuf is complete. The grid depends on count alone, so both
// sides agree on the blocks of every call; the call number and the running total only grow,
// so no earlier call's flag passes for this one. Only block 0 waits after copying and every
// other wait is on a flag that a peer's first running block sets, so the blocks need not be
// resident together.
#include <vector>

constexpr int THREADS = 256;
constexpr size_t MAX_BLOCKS = 128;

struct Flags {
  unsigned long long ready;    // the latest call in which the right neighbour began (set by it)
  unsigned long long arrived;  // blocks the left neighbour pushed here, all calls together
};

__device__ __forceinline__ void st_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(THREADS) ring_push(const float* __restrict__ src,
                                                     float* __restrict__ dst, Flags* own,
                                                     Flags* left, Flags* right, size_t count,
                                                     unsigned long long epoch,
                                                     unsigned long long target) {
  if (threadIdx.x == 0) {
    st_release_sys(&left->ready, epoch);
    while (ld_acquire_sys(&own->ready) < epoch) {
    }
  }
  __syncthreads();
  const size_t vecs = count / 4;
  const size_t stride = (size_t)gridDim.x * THREADS;
  const size_t first = (size_t)blockIdx.x * THREADS + threadIdx.x;
  for (size_t i = first; i < vecs; i += stride)
    reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
  for (size_t i = vecs * 4 + first; i < count; i += stride) dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    atomicAdd_system(&right->arrived, 1ULL);
    if (blockIdx.x == 0) {
      while (ld_acquire_sys(&own->arrived) < target) {
      }
    }
  }
}

static unsigned grid_for(size_t count) {
  size_t blocks = (count / 4 + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  return blocks < 1 ? 1u : (unsigned)blocks;
}

struct Exchange {  // what every rank hands every other rank in a set-up call
  cudaIpcMemHandle_t flags;
  cudaIpcMemHandle_t recv;
};

struct Connection {  // made once: this rank's flags and its neighbours'
  bool made = false;
  Flags* own = nullptr;
  Flags* left = nullptr;
  Flags* right = nullptr;
  unsigned long long epoch = 0;   // calls so far (every rank makes the same calls)
  unsigned long long target = 0;  // blocks the left neighbour has pushed, all calls so far
};

struct Mapping {
  const void* own_recv;  // the key: this rank's recvbuf of the buffer set
  float* right_recv;     // the right neighbour's recvbuf of the same set, mapped here
};

static Connection g_conn;
static std::vector<Mapping> g_maps;
static bool g_last_setup = false;

static int close_all() {
  int err = 0;
  for (const Mapping& m : g_maps)
    if (cudaIpcCloseMemHandle(m.right_recv) != cudaSuccess && !err) err = 20;
  g_maps.clear();
  return err;
}

// A set-up call: exchange the handles, map what is new.
static int set_up(const commbench_ctx* ctx, float* recvbuf) {
  const int world = ctx->world_size, rank = ctx->rank;
  const int left = (rank - 1 + world) % world, right = (rank + 1) % world;
  Connection& c = g_conn;
  Exchange mine;
  if (!c.made) {
    void* p = nullptr;
    if (cudaMalloc(&p, 256) != cudaSuccess) return 21;
    // zeroed before any peer can have the handle (the allgather below comes after)
    if (cudaMemset(p, 0, 256) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 22;
    c.own = (Flags*)p;
  }
  if (cudaIpcGetMemHandle(&mine.flags, c.own) != cudaSuccess) return 23;
  if (cudaIpcGetMemHandle(&mine.recv, recvbuf) != cudaSuccess) return 24;
  std::vector<Exchange> all((size_t)world);
  if (ctx->allgather(ctx->host, &mine, sizeof(mine), all.data()) != 0) return 25;
  if (!c.made) {
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, all[(size_t)right].flags, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
      return 26;
    c.right = (Flags*)p;
    if (left == right) {
      c.left = c.right;  // two ranks: one neighbour, mapped once
    } else {
      if (cudaIpcOpenMemHandle(&p, all[(size_t)left].flags, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
        return 27;
      c.left = (Flags*)p;
    }
    c.made = true;
  }
  for (size_t i = 0; i < g_maps.size(); ++i) {
    if (g_maps[i].own_recv == recvbuf) {  // an old buffer's key: its mapping is stale
      if (cudaIpcCloseMemHandle(g_maps[i].right_recv) != cudaSuccess) return 28;
      g_maps.erase(g_maps.begin() + (long)i);
      break;
    }
  }
  void* p = nullptr;
  if (cudaIpcOpenMemHandle(&p, all[(size_t)right].recv, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
    return 29;
  g_maps.push_back({recvbuf, (float*)p});
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's message
  float* recvbuf = (float*)ctx->buffers[1];  // the left neighbour's message must land here
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // the harness maps no peer buffer and gives no workspace: ctx->peer_buffers and
  // ctx->peer_workspace are NULL; everything shared is exported, exchanged and opened here
  // >>> COMMBENCH EDIT run
  if (world < 2) return 2;  // a ring of one has no neighbour to map
  (void)rank;
  // the host helpers answer 0 in a set-up call and 2 (doing nothing) in any other call
  const int host = ctx->barrier(ctx->host);
  if (host != 0 && host != 2) return 3;
  const bool setup = host == 0;
  if (setup) {
    int rc = g_last_setup ? 0 : close_all();  // a new generation: the old buffers are gone
    if (!rc) rc = set_up(ctx, recvbuf);
    if (rc) return rc;
  }
  g_last_setup = setup;
  float* right_recv = nullptr;
  for (const Mapping& m : g_maps)
    if (m.own_recv == recvbuf) right_recv = m.right_recv;
  if (right_recv == nullptr || !g_conn.made) return 4;  // buffers that had no set-up call

  Connection& c = g_conn;
  const unsigned blocks = grid_for(count);
  const unsigned long long e = ++c.epoch;
  c.target += blocks;  // the left neighbour launches the same grid for the same count
  ring_push<<<blocks, THREADS, 0, stream>>>(sendbuf, right_recv, c.own, c.left, c.right, count,
                                            e, c.target);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
