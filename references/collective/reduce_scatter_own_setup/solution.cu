// Reduce-scatter (sum, float32) over CUDA IPC, set-up included: the harness shares nothing
// between the ranks, so everything they share is allocated, exported, exchanged and opened
// here.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (an MSCCL++-style reduce-scatter over memory channels, with its own connection
// set-up: every rank pulls its block of every rank's sendbuf, nothing is staged).
// Set-up. The first call (a set-up call) allocates this rank's flag area, zeroes it and waits
// for that before any peer can know of it, then exchanges (host allgather) its IPC handle and
// the number of blocks this rank's kernels can hold at once (SM count x occupancy, at most two
// per SM); every rank maps every peer's flags once, for the whole run, and the smallest block
// count bounds every grid, so all ranks can launch the same grid. Every set-up call (the host
// helpers answer 0) also exports this rank's sendbuf and maps the peers' ones, kept under this
// rank's own pair of buffer pointers: every rank uses the same buffer set in the same call, so
// its own pointers name the peers' matching buffers, and an ordinary call finds them there. A
// set-up call that follows an ordinary call begins a new generation of buffers (the old ones
// are gone): every mapping is closed; a mapping kept under this call's pointers belongs to an
// earlier buffer at the same address and is replaced. Only the first call synchronizes the
// device, before any kernel of this solution exists.
// Transfer. One kernel per call, two barriers of flags:
//   1. start: block b of every rank tells block b of every peer "call `epoch` has begun" (its
//      sendbuf holds this call's input) and waits for the same word from every peer;
//   2. the reduction: rank r's block starts at element r * count of every sendbuf, with the
//      same alignment in all of them (all are 256-byte aligned). The floats before its first
//      16-byte boundary (head) and after its last (tail) are summed one by one; in between,
//      each thread loads whole 16-byte vectors from every rank's sendbuf (the peers' over
//      NVLink, UNROLL per rank in flight at once), sums them in rank order and stores the sum
//      into recvbuf (whole vectors when recvbuf's matching place is aligned, else floats);
//   3. end: block b waits until block b of every peer has finished reading, so no rank
//      returns (and lets its caller reuse sendbuf) while a peer still reads it.
// The barriers pair block b with block b only: every rank launches the same grid (from count,
// the world size and the exchanged bound, never from this rank's alignment), all of it
// resident at once. The flag value is a call counter: every rank makes the same calls and it
// grows every call, so no flag of an earlier call (any size, any grid) passes a later barrier.
#include <vector>

constexpr int MAX_RANKS = 8;      // kernels are instantiated for 1..8 ranks
constexpr int MAX_BLOCKS = 1024;  // flag slots per barrier
constexpr int THREADS = 512;
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t start[MAX_BLOCKS][MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][MAX_RANKS];
};

struct Args {
  const float* src[MAX_RANKS];  // this rank's block in every rank's sendbuf, mapped here
  float* dst;                   // own recvbuf
  Flags* flags[MAX_RANKS];      // every rank's flags, mapped here
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
// orders every thread's earlier accesses before the release store (cumulativity); the one
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

__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// the sum of vector i (counted from the block's first 16-byte boundary), stored into recvbuf
__device__ __forceinline__ void put4(float* out, bool aligned, size_t i, float4 s) {
  if (aligned) {
    reinterpret_cast<float4*>(out)[i] = s;
  } else {
    float* p = out + 4 * i;
    p[0] = s.x; p[1] = s.y; p[2] = s.z; p[3] = s.w;
  }
}

template <int N, int UNROLL>
__global__ void __launch_bounds__(THREADS, 2) reduce_scatter_kernel(const Args a) {
  barrier<N>(a, false);

  // floats before the block's first 16-byte boundary, whole vectors, floats after the last
  const size_t past = ((uintptr_t)a.src[0] & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > a.count) head = a.count;
  const size_t vecs = (a.count - head) / 4;
  const size_t tail = a.count - head - vecs * 4;
  float* out = a.dst + head;
  const bool aligned = head == 0;  // recvbuf itself is 16-byte aligned
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
  // UNROLL vectors per thread and rank in flight: all loads first, then the sums and stores
  for (; i + (UNROLL - 1) * stride < vecs; i += UNROLL * stride) {
    float4 v[N][UNROLL];
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        v[r][u] = reinterpret_cast<const float4*>(a.src[r] + head)[i + u * stride];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float4 s = v[0][u];
#pragma unroll
      for (int r = 1; r < N; ++r) s = add4(s, v[r][u]);
      put4(out, aligned, i + u * stride, s);
    }
  }
  for (; i < vecs; i += stride) {
    float4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r) v[r] = reinterpret_cast<const float4*>(a.src[r] + head)[i];
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < N; ++r) s = add4(s, v[r]);
    put4(out, aligned, i, s);
  }
  // the head floats, then the tail floats, one thread each
  if (blockIdx.x == 0 && threadIdx.x < head) {
    const size_t t = threadIdx.x;
    float s = a.src[0][t];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][t];
    a.dst[t] = s;
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    float s = a.src[0][t];
#pragma unroll
    for (int r = 1; r < N; ++r) s += a.src[r][t];
    a.dst[t] = s;
  }

  barrier<N>(a, true);
}

static int unroll_for(int n) { return n <= 2 ? 4 : n <= 4 ? 2 : 1; }

// launches the kernel, or (occupancy != nullptr) reports its resident blocks per SM
template <int N>
static cudaError_t run_for(const Args* a, unsigned blocks, cudaStream_t stream, int* occupancy) {
  constexpr int UNROLL = N <= 2 ? 4 : N <= 4 ? 2 : 1;
  if (occupancy != nullptr)
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(occupancy,
                                                         reduce_scatter_kernel<N, UNROLL>,
                                                         THREADS, 0);
  reduce_scatter_kernel<N, UNROLL><<<blocks, THREADS, 0, stream>>>(*a);
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
  cudaIpcMemHandle_t send;
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
  const float* peer_send[MAX_RANKS];  // the peers' sendbufs of the same set, mapped here
};

static Connection g_conn;
static std::vector<Mapping> g_maps;
static bool g_last_setup = false;  // whether the previous call was a set-up call

// Closes a buffer set's mappings. The peers may have freed those buffers already (they learn
// of a new generation no sooner than this rank), so a close that fails is not this call's
// error: it is dropped, and so is the error state it leaves.
static void unmap(const Mapping& m) {
  for (int r = 0; r < MAX_RANKS; ++r)
    if (m.peer_send[r] != nullptr) cudaIpcCloseMemHandle((void*)m.peer_send[r]);
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
static int connect(const commbench_ctx* ctx, const float* send, const float* recv) {
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
  if (cudaIpcGetMemHandle(&mine.send, (void*)send) != cudaSuccess) return 25;
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
    if (cudaIpcOpenMemHandle(&p, all[(size_t)r].send, cudaIpcMemLazyEnablePeerAccess) !=
        cudaSuccess) {
      unmap(m);
      return 31;
    }
    m.peer_send[r] = (const float*)p;
  }
  g_maps.push_back(m);
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* sendbuf = (const float*)ctx->buffers[0];  // world blocks of count floats
  float* recvbuf = (float*)ctx->buffers[1];              // the sum of block `rank`: count floats
  const size_t count = ctx->buffer_bytes[1] / sizeof(float);
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
  const size_t offset = (size_t)rank * count;  // this rank's block in every sendbuf
  for (int r = 0; r < world; ++r) {
    a.src[r] = (r == rank ? sendbuf : m->peer_send[r]) + offset;
    a.flags[r] = g_conn.flags[r];
  }
  a.dst = recvbuf;
  a.count = count;
  a.rank = rank;
  a.epoch = ++g_conn.epoch;

  // UNROLL vectors per thread while that fits on the GPU at once; from count, the world size
  // and the exchanged bound only, so every rank launches the same grid
  const size_t chunk = (size_t)THREADS * (size_t)unroll_for(world);
  size_t blocks = (count / 4 + chunk - 1) / chunk;
  if (blocks > (size_t)g_conn.max_blocks) blocks = (size_t)g_conn.max_blocks;
  if (blocks < 1) blocks = 1;
  return run_n(world, &a, (unsigned)blocks, stream, nullptr) == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
