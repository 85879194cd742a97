// Sum all-reduce of float32 row blocks with ThunderKittens tiles over CUDA IPC: every rank's
// recvbuf receives the element-wise sum of every rank's [rows, 64] matrix, reduced tile by
// tile by a kernel that synchronizes with its peers through flags in an IPC-shared workspace.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kittens.cuh"

#include "commbench.h"

// ---- the layouts (fixed): ThunderKittens global layouts of every rank's buffers ----------
constexpr int COLS = 64;       // columns of every matrix: a row is 64 float32 (256 bytes)
constexpr int MAX_RANKS = 8;   // world sizes up to 8

// a rank's sendbuf or recvbuf: a [rows, 64] float32 matrix
using rows_gl = kittens::gl<float, 1, 1, -1, COLS>;
// one layout per rank (pgl without multicast: no multicast pointer, mc_ptr is null)
using rows_pgl = kittens::pgl<rows_gl, MAX_RANKS, false>;

struct Layouts {
  rows_pgl send;  // send[r]: rank r's sendbuf, mapped on this GPU (slots r >= world: null)
  rows_pgl recv;  // recv[r]: rank r's recvbuf, mapped on this GPU (slots r >= world: null)
  int rows;       // rows of every matrix: count / 64
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
  return Layouts{rows_pgl(send, nullptr, nullptr, (size_t)rows, nullptr),
                 rows_pgl(recv, nullptr, nullptr, (size_t)rows, nullptr),
                 rows, ctx->rank, ctx->world_size};
}

// >>> COMMBENCH EDIT kernels
// Design (one shot): every block of every rank reads tile t of every rank's sendbuf (its own
// and, over NVLink, its peers'), sums them in shared memory and stores the sum into its own
// recvbuf, with ThunderKittens' shared tiles and group operations.
//   1. start barrier: block b of every rank tells block b of every peer "my call number
//      `epoch` has begun" (so everything its stream did before, writing sendbuf included, is
//      done) and waits for the same word from every peer;
//   2. per row tile: the loads of all N ranks' tiles are issued at once (cp.async), then
//      waited for; the tiles are added element by element into the first (float32, own tile
//      first, then the peers in ring order) and the sum is stored. TK's global<->shared tile
//      moves check rows against the layout: the rows of the last tile past `rows` are filled
//      with zeros on load and skipped on store, so a partial last tile needs nothing more;
//   3. end barrier: block b waits until block b of every peer has finished reading, so no
//      rank returns (and lets its caller overwrite sendbuf) while a peer still reads it.
// The barriers pair block b with block b only: every rank launches the same grid (from the
// row count, the SM count and the occupancy, all the same on every rank), and the grid is
// co-resident (at most the blocks the GPU's share holds at once). The flag value is a call
// counter kept on the host: every rank makes the same calls, and it grows every call, so a
// flag left by an earlier call (any size) never passes a barrier early. The kernel is
// instantiated per world size, so its tile array and its loops are fixed at compile time.
constexpr int THREADS = 128;     // one warpgroup per block
constexpr int TILE_ROWS = 32;    // a 32 x 64 float32 tile: 8 KiB

using tile_t = kittens::st_fl<TILE_ROWS, COLS>;
using wg = kittens::group<THREADS / kittens::WARP_THREADS>;
// dynamic shared memory: one tile per rank plus the allocator's alignment to 1024 bytes
template <int N>
constexpr size_t smem_bytes() { return N * sizeof(tile_t) + 1024; }

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

template <int N>
__global__ void __launch_bounds__(THREADS) tk_allreduce(const __grid_constant__ Layouts L,
                                                        const __grid_constant__ Sync s) {
  extern __shared__ kittens::alignment_dummy smem[];
  kittens::shared_allocator al((int*)&smem[0]);
  tile_t(&tiles)[N] = al.allocate<tile_t, N>();

  cross_rank_barrier(s, L.rank, N, false);

  const int ntiles = row_tiles(L.rows);
  for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
    wg::load_async(tiles[0], L.send[L.rank], {0, 0, t, 0});
#pragma unroll
    for (int k = 1; k < N; ++k) {
      wg::load_async(tiles[k], L.send[(L.rank + k) % N], {0, 0, t, 0});
    }
    wg::load_async_wait(1);  // every thread's copies done, then the whole block's
    // a thread adds the same elements of every tile: no sync between the adds
#pragma unroll
    for (int k = 1; k < N; ++k) wg::add(tiles[0], tiles[0], tiles[k]);
    wg::sync(1);  // the sum is stored by other threads than those that made it
    wg::store(L.recv[L.rank], tiles[0], {0, 0, t, 0});
    wg::sync(1);  // the tiles are refilled next round
  }

  cross_rank_barrier(s, L.rank, N, true);
}

template <int N>
static int launch(const Layouts& L, const Sync& s, int sms, cudaStream_t stream) {
  static int per_sm = 0;  // blocks per SM at once (one value per world size)
  if (!per_sm) {
    int got = 0;
    if (cudaFuncSetAttribute(tk_allreduce<N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem_bytes<N>()) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, tk_allreduce<N>, THREADS,
                                                      smem_bytes<N>()) != cudaSuccess ||
        got < 1)
      return 3;
    per_sm = got < 4 ? got : 4;
  }
  // one row tile per block while that fits on the GPU at once; the same grid on every rank
  int blocks = sms * per_sm;
  if (blocks > row_tiles(L.rows)) blocks = row_tiles(L.rows);
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  tk_allreduce<N><<<blocks, THREADS, smem_bytes<N>(), stream>>>(L, s);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);  // elements of every matrix
  if (ctx->world_size < 1 || ctx->world_size > MAX_RANKS || count % COLS != 0) return 2;
  const Layouts L = make_layouts(ctx, (int)(count / COLS));
  // ctx->workspace / ctx->peer_workspace[r]: zeroed once, IPC-shared, persists across calls
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (ctx->workspace == nullptr || ctx->workspace_bytes < sizeof(Flags)) return 2;
  if (L.rows == 0) return 0;  // the same on every rank: nobody launches, nobody waits
  static uint32_t epoch = 0;  // calls so far; every rank makes the same calls
  static int sms = 0;
  if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device) != cudaSuccess)
    return 3;
  if (sms < 1) return 3;

  Sync s = {};
  for (int r = 0; r < ctx->world_size; ++r) s.peer[r] = (Flags*)ctx->peer_workspace[r];
  s.own = (Flags*)ctx->workspace;
  s.epoch = ++epoch;

  switch (L.world) {
    case 1: return launch<1>(L, s, sms, stream);
    case 2: return launch<2>(L, s, sms, stream);
    case 3: return launch<3>(L, s, sms, stream);
    case 4: return launch<4>(L, s, sms, stream);
    case 5: return launch<5>(L, s, sms, stream);
    case 6: return launch<6>(L, s, sms, stream);
    case 7: return launch<7>(L, s, sms, stream);
    default: return launch<8>(L, s, sms, stream);
  }
  // <<< COMMBENCH EDIT
}
