// Put around a ring over CUDA IPC, set-up included: every rank's kernel stores its message into
// the next rank's recvbuf; the harness shares nothing between the ranks, so everything they
// share is allocated, exported, exchanged and opened here.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (an MSCCL++ memory channel per block, with its own set-up).
// Set-up (host, set-up calls only). The first call (always a set-up call) allocates this rank's
// semaphores, zeroes them and waits for that before any peer can know of them, then exchanges
// (host allgather) their IPC handle and the number of put blocks this rank keeps resident (SM
// share x occupancy, at most two per SM); every rank maps its two neighbours' semaphores once,
// for the whole run, and the smallest resident count of all ranks bounds every grid, so all
// ranks launch the same grid for the same count. Every set-up call (the host helpers answer 0)
// also exports this rank's recvbuf and maps the next rank's recvbuf of the same buffer set,
// kept under this rank's own recvbuf pointer: every rank uses the same set in the same call,
// so its own pointer names the next rank's matching buffer, and an ordinary call finds it
// there. A set-up call that follows an ordinary call begins a new generation (the old buffers
// are gone): every buffer mapping is closed; a mapping kept under this call's pointer belongs
// to an earlier buffer at the same address and is replaced. Only the first call synchronizes
// the device, before any kernel of this solution exists.
// Transfer (one kernel per call; block b pairs with block b of both neighbours):
//   1. block b releases "call `epoch` has begun here" into the previous rank's ready[b] (my
//      recvbuf of this call is poisoned and may be written) and waits (acquire) until the next
//      rank has said the same here;
//   2. its warps copy their share of sendbuf into the next rank's recvbuf: 16-byte vectors,
//      UNROLL loads in flight per thread before the remote stores; the last block also copies
//      the count % 4 floats past the last whole vector;
//   3. after a __syncthreads (every thread's stores ordered before it), one thread releases
//      data[b] = epoch into the next rank's semaphores and waits until the previous rank has
//      done the same here: when every block is past it the incoming message is whole, so this
//      rank's recvbuf is complete when its kernel ends, whatever its peers do afterwards.
// Semaphores hold call numbers kept on the host (every rank makes the same calls, so they
// agree); they only grow and are never cleared (not when the size changes either), so a value
// left by an earlier call never lets a later one through, and a rank is at most one call ahead
// on any semaphore (its next push needs the receiver's next ready). The grid (at most two
// blocks of 512 threads per SM of the smallest share) is co-resident, so a spinning block never
// keeps a block of its own grid from running.
#include <string.h>

#include <vector>

constexpr int THREADS = 512;
constexpr int UNROLL = 4;         // 16-byte vectors in flight per thread
constexpr int MAX_BLOCKS = 1024;  // semaphore slots per direction
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Semaphores {
  uint32_t ready[MAX_BLOCKS];  // set by the next rank: its recvbuf may be written (call number)
  uint32_t data[MAX_BLOCKS];   // set by the previous rank: block b's share has landed here
};

struct Args {
  const float* src;  // own sendbuf
  float* dst;        // the next rank's recvbuf of this buffer set, mapped here
  Semaphores* own;   // this rank's semaphores
  Semaphores* prev;  // the previous rank's, mapped here
  Semaphores* next;  // the next rank's, mapped here
  size_t count;
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

// spin until the semaphore has reached this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

__global__ void __launch_bounds__(THREADS, 2) put_kernel(const Args a) {
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    st_release_sys(&a.prev->ready[b], a.epoch);  // my recvbuf is this call's
    wait_for(&a.own->ready[b], a.epoch);         // the next rank's is too
  }
  __syncthreads();

  const size_t vecs = a.count / 4;
  const float4* src = reinterpret_cast<const float4*>(a.src);
  float4* dst = reinterpret_cast<float4*>(a.dst);
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)b * THREADS + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
    float4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < vecs; i += stride) dst[i] = src[i];
  // the count % 4 floats past the last whole vector
  const size_t tail = a.count - vecs * 4;
  if (b == (int)gridDim.x - 1 && threadIdx.x < tail) {
    const size_t t = vecs * 4 + threadIdx.x;
    a.dst[t] = a.src[t];
  }

  __syncthreads();
  if (threadIdx.x == 0) {
    st_release_sys(&a.next->data[b], a.epoch);  // block b's share is in the next recvbuf
    wait_for(&a.own->data[b], a.epoch);         // and the previous rank's share in mine
  }
}

struct Exchange {  // what every rank hands every other rank in a set-up call
  cudaIpcMemHandle_t sem;
  cudaIpcMemHandle_t recv;
  int blocks;  // put blocks this rank keeps resident
};

struct Channel {  // made in the first call, kept for the run
  bool made = false;
  Semaphores* own = nullptr;
  Semaphores* prev = nullptr;
  Semaphores* next = nullptr;
  int own_blocks = 0;  // this rank's resident blocks
  int max_blocks = 0;  // the smallest over all ranks: every grid's bound
  uint32_t epoch = 0;  // calls so far; every rank makes the same calls
};

struct Mapping {  // one buffer set
  const float* recv;  // the key: this rank's recvbuf of the set
  float* next_recv;   // the next rank's recvbuf of the same set, mapped here
};

static Channel g_ch;
static std::vector<Mapping> g_maps;
static bool g_last_setup = false;  // whether the previous call was a set-up call

// a new generation: the old buffers are gone, and so go their mappings (the harness has
// waited for every earlier call's work; the stream is synchronized anyway, it costs nothing)
static int unmap_all(cudaStream_t stream) {
  if (g_maps.empty()) return 0;
  int err = cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 20;
  for (const Mapping& m : g_maps)
    if (cudaIpcCloseMemHandle(m.next_recv) != cudaSuccess && !err) err = 21;
  g_maps.clear();
  return err;
}

// A set-up call: the channel (first call only), then this buffer set's mapping.
static int connect(const commbench_ctx* ctx, float* recv) {
  const int n = ctx->world_size, rank = ctx->rank;
  const int prev = (rank + n - 1) % n, next = (rank + 1) % n;
  Channel& c = g_ch;
  if (!c.made && c.own == nullptr) {
    void* p = nullptr;
    if (cudaMalloc(&p, sizeof(Semaphores)) != cudaSuccess) return 22;
    // zeroed before any peer can have the handle (the exchange below comes after)
    if (cudaMemset(p, 0, sizeof(Semaphores)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
      return 23;
    c.own = (Semaphores*)p;
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, put_kernel, THREADS, 0) != cudaSuccess)
      return 24;
    c.own_blocks = sms * (per_sm < 2 ? per_sm : 2);
  }
  Exchange mine;
  memset(&mine, 0, sizeof(mine));
  if (cudaIpcGetMemHandle(&mine.sem, c.own) != cudaSuccess) return 25;
  if (cudaIpcGetMemHandle(&mine.recv, recv) != cudaSuccess) return 26;
  mine.blocks = c.own_blocks;
  std::vector<Exchange> all((size_t)n);
  if (ctx->allgather(ctx->host, &mine, sizeof(mine), all.data()) != 0) return 27;
  if (!c.made) {
    int most = MAX_BLOCKS;
    for (const Exchange& e : all) most = e.blocks < most ? e.blocks : most;
    if (most < 1) return 28;
    c.max_blocks = most;
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, all[(size_t)next].sem, cudaIpcMemLazyEnablePeerAccess) !=
        cudaSuccess)
      return 29;
    c.next = (Semaphores*)p;
    if (prev == next) {
      c.prev = c.next;  // two ranks: one neighbour, mapped once
    } else {
      if (cudaIpcOpenMemHandle(&p, all[(size_t)prev].sem, cudaIpcMemLazyEnablePeerAccess) !=
          cudaSuccess)
        return 30;
      c.prev = (Semaphores*)p;
    }
    c.made = true;
  }
  // a mapping kept under this pointer belongs to an earlier buffer at the same address
  for (size_t i = 0; i < g_maps.size(); ++i) {
    if (g_maps[i].recv == recv) {
      const float* old = g_maps[i].next_recv;
      g_maps.erase(g_maps.begin() + (long)i);
      if (cudaIpcCloseMemHandle((void*)old) != cudaSuccess) return 31;
      break;
    }
  }
  void* p = nullptr;
  if (cudaIpcOpenMemHandle(&p, all[(size_t)next].recv, cudaIpcMemLazyEnablePeerAccess) !=
      cudaSuccess)
    return 32;
  g_maps.push_back({recv, (float*)p});
  return 0;
}

static float* find(const float* recv) {
  for (size_t i = g_maps.size(); i-- > 0;)
    if (g_maps[i].recv == recv) return g_maps[i].next_recv;
  return nullptr;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's message: count floats
  float* recvbuf = (float*)ctx->buffers[1];  // gets the message of rank (rank - 1) % world
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // the harness maps no peer buffer and gives no workspace: ctx->peer_buffers and
  // ctx->peer_workspace are NULL; the host helpers work only in set-up calls
  // >>> COMMBENCH EDIT run
  if (world < 2 || world > COMMBENCH_MAX_RANKS) return 2;  // a ring needs a neighbour
  (void)rank;
  // the host helpers answer 0 in a set-up call and 2 (doing nothing) in any other call
  const int host = ctx->barrier(ctx->host);
  if (host != 0 && host != 2) return 3;
  const bool setup = host == 0;
  if (setup) {
    int rc = g_last_setup ? 0 : unmap_all(stream);  // a new generation
    if (!rc) rc = connect(ctx, recvbuf);
    if (rc) return rc;
  }
  g_last_setup = setup;
  float* next_recv = find(recvbuf);
  if (next_recv == nullptr || !g_ch.made) return 4;  // buffers that had no set-up call
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits

  Args a;
  a.src = sendbuf;
  a.dst = next_recv;
  a.own = g_ch.own;
  a.prev = g_ch.prev;
  a.next = g_ch.next;
  a.count = count;
  a.epoch = ++g_ch.epoch;

  // UNROLL vectors per thread while that fits in the resident bound; from count and the
  // exchanged bound only, so every rank launches the same grid
  const size_t vecs = count / 4;
  size_t blocks = (vecs + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  if (blocks > (size_t)g_ch.max_blocks) blocks = (size_t)g_ch.max_blocks;
  if (blocks < 1) blocks = 1;
  put_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
