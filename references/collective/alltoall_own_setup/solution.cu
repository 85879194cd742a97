// All-to-all over CUDA IPC, set-up included: block j of every rank's sendbuf ends up as block
// `rank` of rank j's recvbuf; the harness shares nothing between the ranks, so everything they
// share is allocated, exported, exchanged and opened here.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (MSCCL++'s all-to-all over memory channels, a channel per pair of ranks and per
// block, with its own set-up).
// Set-up (host, set-up calls only). The first call (always a set-up call) allocates this rank's
// flags, zeroes them and waits for that before any peer can know of them, then exchanges (host
// allgather) their IPC handle and the number of blocks this rank keeps resident (SM share x
// occupancy, at most two per SM); every rank maps every peer's flags once, for the whole run,
// and the smallest resident count of all ranks bounds every grid, so all ranks launch the same
// grid for the same count. Every set-up call (the host helpers answer 0) also exports this
// rank's recvbuf and maps every peer's recvbuf of the same buffer set, kept under this rank's
// own recvbuf pointer: every rank uses the same set in the same call, so its own pointer names
// the peers' matching buffers, and an ordinary call finds them there. A set-up call that
// follows an ordinary call begins a new generation (the old buffers are gone): every buffer
// mapping is closed; a mapping kept under this call's pointer belongs to an earlier buffer at
// the same address and is replaced. Only the first call synchronizes the device, before any
// kernel of this solution exists.
// Transfer (one kernel per call):
//   1. block b tells every peer "my call number `epoch` has begun: block b's share of my
//      recvbuf may be written" (a release store into the peer's ready[b][rank]), then copies
//      its share of this rank's own block locally;
//   2. for every peer j in turn, starting with the next rank (so the ranks spread their
//      traffic over the peers instead of all writing to rank 0 first): wait (acquire) until j
//      has said its call began, store the block's share of sendbuf block j into block `rank`
//      of j's recvbuf, and after a __syncthreads signal j's data[b][rank] with a release
//      store; a late peer holds up only the pushes to it;
//   3. wait until every peer has signalled data[b][peer]: when every block has got past this,
//      every peer's block is in recvbuf, so this rank's output is complete when its kernel
//      ends, whatever its peers do afterwards.
// The copies store whole 16-byte vectors from the destination's first 16-byte boundary on
// (blocks start at i * count, which need not be aligned): the floats before it and after the
// last vector go one by one, and the source is loaded in whole vectors when it is aligned
// there too, float by float otherwise. Flags pair block b with block b; the grid (at most two
// blocks of 512 threads per SM of the smallest share) is co-resident. The flag value is a call
// counter kept on the host: every rank makes the same calls, it grows every call and is never
// reset (not when the size changes either), so a flag left by an earlier call never lets a
// wait through (a peer is never a call ahead on a flag: its next push needs this rank's next
// ready).
#include <string.h>

#include <vector>

constexpr int MAX_RANKS = 8;
constexpr int MAX_BLOCKS = 1024;  // flag slots per direction and peer
constexpr int THREADS = 512;
constexpr int UNROLL = 4;  // 16-byte vectors in flight per thread
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t ready[MAX_BLOCKS][MAX_RANKS];  // [block][from rank]: its call has begun
  uint32_t data[MAX_BLOCKS][MAX_RANKS];   // [block][from rank]: its share is here
};

struct Args {
  const float* src;              // own sendbuf
  float* dst[MAX_RANKS];         // every rank's recvbuf of this buffer set, mapped here
  Flags* flags[MAX_RANKS];       // every rank's flags, mapped here (own at [rank])
  size_t count;                  // floats per block
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

// spin until the flag has reached this call's number
__device__ __forceinline__ void wait_for(const uint32_t* p, uint32_t epoch) {
  const uint64_t start = now_ns();
  while (ld_acquire_sys(p) < epoch) {
    if (now_ns() - start > WAIT_LIMIT_NS) __trap();
  }
}

// this block's share of copying `count` floats from src to dst
__device__ __forceinline__ void copy_share(float* dst, const float* src, size_t count) {
  const size_t past = ((uintptr_t)dst & 15) / sizeof(float);
  size_t head = (4 - past) & 3;
  if (head > count) head = count;
  const size_t vecs = (count - head) / 4;
  const size_t tail = count - head - vecs * 4;
  float4* d = reinterpret_cast<float4*>(dst + head);
  const float* s = src + head;
  const size_t stride = (size_t)gridDim.x * THREADS;
  size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
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
  } else {  // the source is off by 4, 8 or 12 bytes: four loads per vector (local, cheap)
    for (; i < vecs; i += stride) {
      const float* p = s + 4 * i;
      d[i] = make_float4(p[0], p[1], p[2], p[3]);
    }
  }
  // the head and tail floats, one thread each
  if (blockIdx.x == 0 && threadIdx.x < head) dst[threadIdx.x] = src[threadIdx.x];
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const size_t t = head + vecs * 4 + threadIdx.x;
    dst[t] = src[t];
  }
}

__global__ void __launch_bounds__(THREADS, 2) alltoall_kernel(const Args a) {
  const int b = blockIdx.x;
  const int me = a.rank;
  Flags* own = a.flags[me];
  if ((int)threadIdx.x < a.n && (int)threadIdx.x != me)
    st_release_sys(&a.flags[threadIdx.x]->ready[b][me], a.epoch);  // my recvbuf is this call's
  copy_share(a.dst[me] + (size_t)me * a.count, a.src + (size_t)me * a.count, a.count);

  for (int k = 1; k < a.n; ++k) {
    const int j = (me + k) % a.n;
    if (threadIdx.x == 0) wait_for(&own->ready[b][j], a.epoch);  // j's recvbuf is too
    __syncthreads();
    copy_share(a.dst[j] + (size_t)me * a.count, a.src + (size_t)j * a.count, a.count);
    __syncthreads();
    if (threadIdx.x == 0) st_release_sys(&a.flags[j]->data[b][me], a.epoch);
  }

  if ((int)threadIdx.x < a.n && (int)threadIdx.x != me)
    wait_for(&own->data[b][threadIdx.x], a.epoch);  // the peer's share is in my recvbuf
}

struct Exchange {  // what every rank hands every other rank in a set-up call
  cudaIpcMemHandle_t flags;
  cudaIpcMemHandle_t recv;
  int blocks;  // blocks this rank keeps resident
};

struct Connection {  // made in the first call, kept for the run
  bool made = false;
  Flags* flags[MAX_RANKS] = {};  // every rank's flags (this rank's own at [rank])
  int own_blocks = 0;            // this rank's resident blocks
  int max_blocks = 0;            // the smallest over all ranks: every grid's bound
  uint32_t epoch = 0;            // calls so far; every rank makes the same calls
};

struct Mapping {  // one buffer set
  const float* recv;             // the key: this rank's recvbuf of the set
  float* peer_recv[MAX_RANKS];   // the peers' recvbufs of the same set, mapped here
};

static Connection g_conn;
static std::vector<Mapping> g_maps;
static bool g_last_setup = false;  // whether the previous call was a set-up call

static int unmap(const Mapping& m) {
  int err = 0;
  for (int r = 0; r < MAX_RANKS; ++r)
    if (m.peer_recv[r] != nullptr && cudaIpcCloseMemHandle(m.peer_recv[r]) != cudaSuccess)
      err = 30;
  return err;
}

// a new generation: the old buffers are gone, and so go their mappings (the harness has
// waited for every earlier call's work; the stream is synchronized anyway, it costs nothing)
static int unmap_all(cudaStream_t stream) {
  if (g_maps.empty()) return 0;
  int err = cudaStreamSynchronize(stream) == cudaSuccess ? 0 : 20;
  for (const Mapping& m : g_maps) {
    const int e = unmap(m);
    if (e && !err) err = e;
  }
  g_maps.clear();
  return err;
}

static const Mapping* find(const float* recv) {
  for (size_t i = g_maps.size(); i-- > 0;)
    if (g_maps[i].recv == recv) return &g_maps[i];
  return nullptr;
}

// A set-up call: the connection (first call only), then this buffer set's mappings.
static int connect(const commbench_ctx* ctx, float* recv) {
  const int n = ctx->world_size, rank = ctx->rank;
  Connection& c = g_conn;
  if (!c.made && c.flags[rank] == nullptr) {
    void* p = nullptr;
    if (cudaMalloc(&p, sizeof(Flags)) != cudaSuccess) return 21;
    // zeroed before any peer can have the handle (the exchange below comes after)
    if (cudaMemset(p, 0, sizeof(Flags)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      return 22;
    c.flags[rank] = (Flags*)p;
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, alltoall_kernel, THREADS, 0) !=
            cudaSuccess)
      return 23;
    c.own_blocks = sms * (per_sm < 2 ? per_sm : 2);
  }
  Exchange mine;
  memset(&mine, 0, sizeof(mine));
  if (cudaIpcGetMemHandle(&mine.flags, c.flags[rank]) != cudaSuccess) return 24;
  if (cudaIpcGetMemHandle(&mine.recv, recv) != cudaSuccess) return 25;
  mine.blocks = c.own_blocks;
  std::vector<Exchange> all((size_t)n);
  if (ctx->allgather(ctx->host, &mine, sizeof(mine), all.data()) != 0) return 26;
  if (!c.made) {
    int most = MAX_BLOCKS;
    for (const Exchange& e : all) most = e.blocks < most ? e.blocks : most;
    if (most < 1) return 27;
    c.max_blocks = most;
    for (int r = 0; r < n; ++r) {
      if (r == rank) continue;
      void* p = nullptr;
      if (cudaIpcOpenMemHandle(&p, all[(size_t)r].flags, cudaIpcMemLazyEnablePeerAccess) !=
          cudaSuccess)
        return 28;
      c.flags[r] = (Flags*)p;
    }
    c.made = true;
  }
  // a mapping kept under this pointer belongs to an earlier buffer at the same address
  for (size_t i = 0; i < g_maps.size(); ++i) {
    if (g_maps[i].recv == recv) {
      const int e = unmap(g_maps[i]);
      g_maps.erase(g_maps.begin() + (long)i);
      if (e) return e;
      break;
    }
  }
  Mapping m = {};
  m.recv = recv;
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, all[(size_t)r].recv, cudaIpcMemLazyEnablePeerAccess) !=
        cudaSuccess) {
      unmap(m);
      return 29;
    }
    m.peer_recv[r] = (float*)p;
  }
  g_maps.push_back(m);
  return 0;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int world = ctx->world_size;
  const float* sendbuf = (const float*)ctx->buffers[0];  // world blocks of count floats: block j for rank j
  float* recvbuf = (float*)ctx->buffers[1];              // world blocks of count floats: block i from rank i
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / (size_t)world;  // floats per block
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
    int rc = g_last_setup ? 0 : unmap_all(stream);  // a new generation
    if (!rc) rc = connect(ctx, recvbuf);
    if (rc) return rc;
  }
  g_last_setup = setup;
  const Mapping* m = find(recvbuf);
  if (m == nullptr || !g_conn.made) return 4;  // buffers that had no set-up call
  if (count == 0) return 0;  // the same on every rank: nobody launches, nobody waits

  Args a = {};
  a.src = sendbuf;
  for (int r = 0; r < world; ++r) {
    a.dst[r] = m->peer_recv[r];
    a.flags[r] = g_conn.flags[r];
  }
  a.dst[rank] = recvbuf;
  a.count = count;
  a.rank = rank;
  a.n = world;
  a.epoch = ++g_conn.epoch;

  // UNROLL vectors of a block per thread while that fits in the resident bound; from count and
  // the exchanged bound only, so every rank launches the same grid
  size_t blocks = (count / 4 + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
  if (blocks > (size_t)g_conn.max_blocks) blocks = (size_t)g_conn.max_blocks;
  if (blocks < 1) blocks = 1;
  alltoall_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
