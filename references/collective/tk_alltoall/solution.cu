// All-to-all of float32 row blocks with ThunderKittens tiles over CUDA IPC: slab d of rank
// s's [world, rows, 64] sendbuf becomes slab s of rank d's recvbuf, moved tile by tile by a
// kernel that synchronizes with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kittens.cuh"

#include "commbench.h"

// ---- the layouts (fixed): ThunderKittens global layouts of every rank's buffers ----------
constexpr int COLS = 64;       // columns of every matrix: a row is 64 float32 (256 bytes)
constexpr int MAX_RANKS = 8;   // world sizes up to 8

// a rank's sendbuf or recvbuf: [world, rows, 64]; in sendbuf depth index d is the slab meant
// for rank d, in recvbuf depth index s is the slab that came from rank s
using slabs_gl = kittens::gl<float, 1, -1, -1, COLS>;
// one layout per rank (pgl without multicast: no multicast pointer, mc_ptr is null)
using slabs_pgl = kittens::pgl<slabs_gl, MAX_RANKS, false>;

struct Layouts {
  slabs_pgl send;  // send[r]: rank r's sendbuf, mapped on this GPU (slots r >= world: null)
  slabs_pgl recv;  // recv[r]: rank r's recvbuf, mapped on this GPU (slots r >= world: null)
  int rows;        // rows of one slab: count / 64
  int rank;
  int world;
};

// Built on the host from the buffers the harness mapped through CUDA IPC.
static Layouts make_layouts(const commbench_ctx* ctx, int rows) {
  float* send[MAX_RANKS] = {};
  float* recv[MAX_RANKS] = {};
  for (int r = 0; r < ctx->world_size; ++r) {
    send[r] = (float*)ctx->peer_buffers[r][0];
    recv[r] = (float*)ctx->peer_buffers[r][1];
  }
  const size_t world = (size_t)ctx->world_size;
  return Layouts{slabs_pgl(send, nullptr, world, (size_t)rows, nullptr),
                 slabs_pgl(recv, nullptr, world, (size_t)rows, nullptr),
                 rows, ctx->rank, ctx->world_size};
}

// >>> COMMBENCH EDIT kernels
// Design (pull): every block of every rank copies whole tiles of the slabs meant for this
// rank, out of every rank's sendbuf, into its own recvbuf, through shared-memory tiles of
// ThunderKittens.
//   1. start barrier: block b of every rank tells block b of every peer "my call number
//      `epoch` has begun" (so everything its stream did before, writing sendbuf included, is
//      done) and waits for the same word from every peer;
//   2. work items are (source rank, row tile) pairs; a block takes STAGES consecutive items
//      at a time, issues all their loads at once (cp.async of slab `rank` of the source's
//      sendbuf, over NVLink for a peer), waits, and stores the tiles into slab `source` of its
//      recvbuf. TK's global<->shared tile moves check rows against the layout: the rows of
//      the last tile past `rows` are filled with zeros on load and skipped on store, so a
//      partial last tile needs nothing more (the columns are always the whole 64);
//   3. end barrier: block b waits until block b of every peer has finished reading, so no
//      rank returns (and lets its caller overwrite sendbuf) while a peer still reads it.
// The barriers pair block b with block b only: every rank launches the same grid (from the
// row count, the SM count and the occupancy, all the same on every rank), and the grid is
// co-resident (at most the blocks the GPU's share holds at once). The flag value is a call
// counter kept on the host: every rank makes the same calls, and it grows every call, so a
// flag left by an earlier call (any size) never passes a barrier early.
constexpr int THREADS = 128;     // one warpgroup per block
constexpr int TILE_ROWS = 32;    // a 32 x 64 float32 tile: 8 KiB
constexpr int STAGES = 4;        // tiles in flight per block

using tile_t = kittens::st_fl<TILE_ROWS, COLS>;
using wg = kittens::group<THREADS / kittens::WARP_THREADS>;
// dynamic shared memory: the tiles plus the allocator's alignment to 1024 bytes
constexpr size_t SMEM_BYTES = STAGES * sizeof(tile_t) + 1024;

// row tiles of one matrix, the last one partial where rows is no multiple of TILE_ROWS
__host__ __device__ __forceinline__ int row_tiles(int rows) {
  return (rows + TILE_ROWS - 1) / TILE_ROWS;
}

constexpr int MAX_BLOCKS = 1024; // flag slots per barrier
constexpr uint64_t WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;  // a lost peer: trap, not hang

struct Flags {
  uint32_t start[MAX_BLOCKS][COMMBENCH_MAX_RANKS];  // [block][from rank]
  uint32_t end[MAX_BLOCKS][COMMBENCH_MAX_RANKS];
};

struct Sync {
  Flags* peer[MAX_RANKS];  // every rank's workspace, mapped here
  Flags* own;
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

// Barrier of block blockIdx.x with block blockIdx.x of every other rank. The __syncthreads
// before orders the block's earlier accesses before the release store; the one after hands
// the acquired state to the whole block.
__device__ __forceinline__ void cross_rank_barrier(const Sync& s, int rank, int world,
                                                   bool at_end) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < world && peer != rank) {
    Flags* theirs = s.peer[peer];
    uint32_t* out = at_end ? &theirs->end[blockIdx.x][rank] : &theirs->start[blockIdx.x][rank];
    const uint32_t* in = at_end ? &s.own->end[blockIdx.x][peer] : &s.own->start[blockIdx.x][peer];
    st_release_sys(out, s.epoch);
    wait_for(in, s.epoch);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(THREADS) tk_alltoall(const __grid_constant__ Layouts L,
                                                       const __grid_constant__ Sync s) {
  extern __shared__ kittens::alignment_dummy smem[];
  kittens::shared_allocator al((int*)&smem[0]);
  tile_t(&tiles)[STAGES] = al.allocate<tile_t, STAGES>();

  cross_rank_barrier(s, L.rank, L.world, false);

  const int items = row_tiles(L.rows) * L.world;
  for (int base = blockIdx.x * STAGES; base < items; base += gridDim.x * STAGES) {
#pragma unroll
    for (int k = 0; k < STAGES; ++k) {
      const int item = base + k;
      if (item < items) {
        const int src = (L.rank + item % L.world) % L.world;  // own slab first, then peers
        wg::load_async(tiles[k], L.send[src], {0, L.rank, item / L.world, 0});
      }
    }
    wg::load_async_wait(1);  // every thread's copies done, then the whole block's
#pragma unroll
    for (int k = 0; k < STAGES; ++k) {
      const int item = base + k;
      if (item < items) {
        const int src = (L.rank + item % L.world) % L.world;
        wg::store(L.recv[L.rank], tiles[k], {0, src, item / L.world, 0});
      }
    }
    wg::sync(1);  // the tiles are refilled next round
  }

  cross_rank_barrier(s, L.rank, L.world, true);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  if (ctx->world_size < 1 || ctx->world_size > MAX_RANKS) return 2;
  // elements of one slab
  const size_t count = ctx->buffer_bytes[0] / sizeof(float) / (size_t)ctx->world_size;
  if (count % COLS != 0) return 2;
  const Layouts L = make_layouts(ctx, (int)(count / COLS));
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (L.rows == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int resident = 0;    // blocks of the kernel the GPU's share holds at once
  if (!resident) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess ||
        cudaFuncSetAttribute(tk_alltoall, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)SMEM_BYTES) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tk_alltoall, THREADS,
                                                      SMEM_BYTES) != cudaSuccess ||
        sms < 1 || per_sm < 1)
      return 3;
    resident = sms * (per_sm < 4 ? per_sm : 4);
  }

  Sync s = {};
  for (int r = 0; r < ctx->world_size; ++r) s.peer[r] = (Flags*)ctx->peer_workspace[r];
  s.own = (Flags*)ctx->workspace;
  s.epoch = ++epoch;

  // STAGES items per block while that fits on the GPU at once; the same grid on every rank
  const int items = row_tiles(L.rows) * ctx->world_size;
  int blocks = (items + STAGES - 1) / STAGES;
  if (blocks > resident) blocks = resident;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  tk_alltoall<<<blocks, THREADS, SMEM_BYTES, stream>>>(L, s);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
