// All-gather (float32) over CUDA IPC, set-up included: the harness shares nothing between the
// ranks, so everything they share is allocated, exported, exchanged and opened here.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (a full mesh of memory channels, as MSCCL++'s all-gather over NVLink, with its own
// connection set-up: every rank pushes its block into every rank's recvbuf, nothing staged).
// Set-up. The first call (a set-up call) allocates this rank's flag area, zeroes it and waits
// for that before any peer can know of it, then exchanges (host allgather) its IPC handle and
// the number of blocks this rank's kernels can hold at once (SM count x occupancy, at most two
// per SM); every rank maps every peer's flags once, for the whole run, and the smallest block
// count bounds every grid, so all ranks can launch the same grid. Every set-up call (the host
// helpers answer 0) also exports this rank's recvbuf and maps the peers' ones, kept under this
// rank's own pair of buffer pointers: every rank uses the same buffer set in the same call, so
// its own pointers name the peers' matching buffers, and an ordinary call finds them there. A
// set-up call that follows an ordinary call begins a new generation of buffers (the old ones
// are gone): every mapping is closed; a mapping kept under this call's pointers belongs to an
// earlier buffer at the same address and is replaced. Only the first call synchronizes the
// device, before any kernel of this solution exists.
// Transfer. One kernel per call, two barriers of flags:
//   1. start: block b of every rank tells block b of every peer "call `epoch` has begun" (its
//      recvbuf is this call's and may be written) and waits for the same word from every peer;
//   2. push: the block's threads load their share of sendbuf once and store it into this
//      rank's slot (elements rank * count ..) of every rank's recvbuf, its own included, with
//      16-byte stores (UNROLL vectors in flight per thread). The slot has the same alignment
//      in every recvbuf (all are 256-byte aligned), so the floats before its first 16-byte
//      boundary (head) and after its last (tail) go one by one; the vectors in between are
//      loaded whole when the source is aligned too, else float by float;
//   3. end: block b waits until block b of every peer has pushed its share (released by the
//      flag store after the block's stores), so when this rank's kernel ends every slot of its
//      recvbuf is complete, whatever its peers do afterwards.
// The barriers pair block b with block b only: every rank launches the same grid (from count
// and the exchanged bound, never from this rank's alignment), all of it resident at once. The
// flag value is a call counter: every rank makes the same calls and it grows every call, so no
// flag of an earlier call (any size, any grid) passes a later barrier.
#include <vector>

constexpr int MAX_RANKS = 8;      // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;  // flag slots per barrier
constexpr int THREADS = 512;
constexpr int UNROLL = 4;         // 16-byte vectors in flight per thread
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t start[MAX_BLOCKS][MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][MAX_RANKS];
};

struct Args {
  const float* src;         // own sendbuf
  float* dst[MAX_RANKS];    // this rank's slot in every rank's recvbuf, mapped here
  Flags* flags[MAX_RANKS];  // every rank's flags, mapped here
  size_t count;
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

// spin until the flag has reached this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// Block-level barrier with block blockIdx.x of every other rank. The __syncthreads before
// orders every thread's earlier stores before the release store (cumulativity); the one
// after hands the acquired state to the whole block.
template <int N>
__device__ __forceinline__ void barrier(const Args& a, bool at_end) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < N && peer != a.rank) {
    Flags* theirs = a.flags[peer];
    Flags* mine = a.flags[a.rank];
    uint32_t* out = at_end ? &theirs->end[blockIdx.x][a.rank] : &theirs->start[blockIdx.x][a.rank];
    const uint32_t* in = at_end ? &mine->end[blockIdx.x][peer] : &mine->start[blockIdx.x][peer];
    st_release_sys(out, a.epoch);
    wait_for(in, a.epoch);
  }
  __syncthreads();
}

template <int N>
__device__ __forceinline__ void store_all(const Args& a, size_t head, size_t i, float4 v) {
#pragma unroll
  for (int r = 0; r < N; ++r) reinterpret_cast<float4*>(a.dst[r] + head)[i] = v;
}

template <int N>
__global__ void __launch_bounds__(THREADS, 2) allgather_kernel(const Args a) {
  barrier<N>(a, false);

  // floats before the slot's first 16-byte boundary, whole vectors, floats after the last
  const size_t past = ((uintptr_t)a.dst[a.rank] & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > a.count) head = a.count;
  const size_t vecs = (a.count - head) / 4;
  const size_t tail = a.count - head - vecs * 4;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  if (head == 0) {  // the source is 16-byte aligned as well
    const float4* src = reinterpret_cast<const float4*>(a.src);
    for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
      float4 v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) store_all<N>(a, 0, i + u * stride, v[u]);
    }
    for (; i < vecs; i += stride) store_all<N>(a, 0, i, src[i]);
  } else {  // the source is not: four loads per vector (local, cheap)
    const float* src = a.src + head;
    for (; i < vecs; i += stride) {
      const float* p = src + 4 * i;
      store_all<N>(a, head, i, make_float4(p[0], p[1], p[2], p[3]));
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

  barrier<N>(a, true);
}

// launches the kernel, or (occupancy != nullptr) reports its resident blocks per SM
template <int N>
static cudaError_t run_for(const Args* a, unsigned blocks, cudaStream_t stream, int* occupancy) {
  if (occupancy != nullptr)
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(occupancy, allgather_kernel<N>, THREADS,
                                                         0);
  allgather_kernel<N><<<blocks, THREADS, 0, stream>>>(*a);
  return cudaGetLastError();
}

static cudaError_t run_n(int n, const Args* a, unsigned blocks, cudaStream_t stream,
                         int* occupancy) {
  switch (n) {
    case 1: return run_for<1>(a, blocks, stream, occupancy);
    case 2: return run_for<2>(a, blocks, stream, occupancy);
    case 3: return run_for<3>(a, blocks, stream, occupancy);
    case 4: return run_for<4>(a, blocks, stream, occupancy);
    case 5: return run_for<5>(a, blocks, stream, occupancy);
    case 6: return run_for<6>(a, blocks, stream, occupancy);
    case 7: return run_for<7>(a, blocks, stream, occupancy);
    default: return run_for<8>(a, blocks, stream, occupancy);
  }
}

struct Exchange {  // what every rank hands every other rank in a set-up call
  cudaIpcMemHandle_t flags;
  cudaIpcMemHandle_t recv;
  int blocks;  // blocks of this rank's kernel resident at once
};

struct Connection {  // made in the first call, kept for the run
  bool made = false;
  Flags* flags[MAX_RANKS] = {};  // every rank's flags (this rank's own at [rank])
  int own_blocks = 0;            // this rank's resident blocks
  int max_blocks = 0;            // the smallest over all ranks: every grid's bound
  uint32_t epoch = 0;            // calls so far; every rank makes the same calls
};

struct Mapping {  // one buffer set
  const float* send;  // the key: this rank's sendbuf and recvbuf of the set
  const float* recv;
  float* peer_recv[MAX_RANKS];  // the peers' recvbufs of the same set, mapped here
};

static Connection g_conn;
static std::vector<Mapping> g_maps;
static bool g_last_setup = false;  // whether the previous call was a set-up call

// Closes a buffer set's mappings. The peers may have freed those buffers already (they learn
// of a new generation no sooner than this rank), so a close that fails is not this call's
// error: it is dropped, and so is the error state it leaves.
static void unmap(const Mapping& m) {
  for (int r = 0; r < MAX_RANKS; ++r)
    if (m.peer_recv[r] != nullptr) cudaIpcCloseMemHandle(m.peer_recv[r]);
  (void)cudaGetLastError();
}

static void unmap_all() {
  for (const Mapping& m : g_maps) unmap(m);
  g_maps.clear();
}

static const Mapping* find(const float* send, const float* recv) {
  for (size_t i = g_maps.size(); i-- > 0;)
    if (g_maps[i].send == send && g_maps[i].recv == recv) return &g_maps[i];
  return nullptr;
}

// A set-up call: the connection (first call only), then this buffer set's mappings.
static int connect(const commbench_ctx* ctx, const float* send, float* recv) {
  const int n = ctx->world_size, rank = ctx->rank;
  Connection& c = g_conn;
  if (!c.made && c.flags[rank] == nullptr) {
    void* p = nullptr;
    if (cudaMalloc(&p, sizeof(Flags)) != cudaSuccess) return 20;
    // zeroed before any peer can have the handle (the exchange below comes after)
    if (cudaMemset(p, 0, sizeof(Flags)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      return 21;
    c.flags[rank] = (Flags*)p;
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
      return 22;
    if (run_n(n, nullptr, 0, nullptr, &per_sm) != cudaSuccess) return 23;
    c.own_blocks = sms * (per_sm < 2 ? per_sm : 2);
  }
  Exchange mine = {};
  if (cudaIpcGetMemHandle(&mine.flags, c.flags[rank]) != cudaSuccess) return 24;
  if (cudaIpcGetMemHandle(&mine.recv, recv) != cudaSuccess) return 26;
  mine.blocks = c.own_blocks;
  std::vector<Exchange> all((size_t)n);
  if (ctx->allgather(ctx->host, &mine, sizeof(mine), all.data()) != 0) return 27;
  if (!c.made) {
    int most = MAX_BLOCKS;
    for (const Exchange& e : all) most = e.blocks < most ? e.blocks : most;
    if (most < 1) return 28;
    c.max_blocks = most;
    for (int r = 0; r < n; ++r) {
      if (r == rank) continue;
      void* p = nullptr;
      if (cudaIpcOpenMemHandle(&p, all[(size_t)r].flags, cudaIpcMemLazyEnablePeerAccess) !=
          cudaSuccess)
        return 29;
      c.flags[r] = (Flags*)p;
    }
    c.made = true;
  }
  // a mapping kept under these pointers belongs to earlier buffers at the same addresses
  for (size_t i = 0; i < g_maps.size(); ++i) {
    if (g_maps[i].send == send && g_maps[i].recv == recv) {
      unmap(g_maps[i]);
      g_maps.erase(g_maps.begin() + (long)i);
      break;
    }
  }
  Mapping m = {};
  m.send = send;
  m.recv = recv;
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, all[(size_t)r].recv, cudaIpcMemLazyEnablePeerAccess) !=
        cudaSuccess) {
      unmap(m);
      return 32;
    }
    m.peer_recv[r] = (float*)p;
  }
  g_maps.push_back(m);
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // this rank's block: count floats
  float* recvbuf = (float*)ctx->buffers[1];              // all blocks: world * count floats
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // the harness maps no peer buffer and gives no workspace: ctx->peer_buffers and
  // ctx->peer_workspace are NULL; the host helpers work only in set-up calls
  // >>> COMMBENCH EDIT run
  if (world < 1 || world > MAX_RANKS) return 2;
  // the host helpers answer 0 in a set-up call and 2 (doing nothing) in any other call
  const int host = ctx->barrier(ctx->host);
  if (host != 0 && host != 2) return 3;
  const bool setup = host == 0;
  if (setup) {
    if (!g_last_setup) unmap_all();  // a new generation: the old buffers are gone
    const int rc = connect(ctx, sendbuf, recvbuf);
    if (rc) return rc;
  }
  g_last_setup = setup;
  const Mapping* m = find(sendbuf, recvbuf);
  if (m == nullptr || !g_conn.made) return 4;  // buffers that had no set-up call
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits

  Args a = {};
  a.src = sendbuf;
  const size_t offset = (size_t)rank * count;  // this rank's slot in every recvbuf
  for (int r = 0; r < world; ++r) {
    a.dst[r] = (r == rank ? recvbuf : m->peer_recv[r]) + offset;
    a.flags[r] = g_conn.flags[r];
  }
  a.count = count;
  a.rank = rank;
  a.epoch = ++g_conn.epoch;

  // UNROLL vectors per thread while that fits on the GPU at once; from count and the
  // exchanged bound only, so every rank launches the same grid
  const size_t chunk = (size_t)THREADS * UNROLL;
  size_t blocks = (count / 4 + chunk - 1) / chunk;
  if (blocks > (size_t)g_conn.max_blocks) blocks = (size_t)g_conn.max_blocks;
  if (blocks < 1) blocks = 1;
  return run_n(world, &a, (unsigned)blocks, stream, nullptr) == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
