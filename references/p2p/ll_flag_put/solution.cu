// Ring exchange with the LL ("low latency") protocol: every rank pushes its sendbuf to its right
// neighbour as 8-byte {data, flag} words stored straight into that neighbour's workspace; the
// receiver polls the words and unpacks them into its recvbuf.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT kernels
// Design (NCCL's LL protocol):
//   - a 16-byte line carries two floats, each in its own 8-byte half {data (low 32 bits),
//     flag (high 32 bits)}; the sender writes a line with one 16-byte store made of two 64-bit
//     elements, each of which lands whole, so a half whose flag is this call's also holds this
//     call's data: no fence and no separate ready flag;
//   - the flag is the call number (epoch, a host counter that every rank advances alike), so a
//     line left over from an earlier call never passes for this one;
//   - the receiver's workspace has two slots of lines; call e uses slot e % 2. Before a block
//     overwrites its lines of a slot, it waits until the right neighbour's block of the same
//     index has acknowledged reading them in call e - 2 (the slot's previous use): a rank may
//     run calls ahead of its right neighbour when calls come back to back;
//   - the grid is fixed (BLOCKS blocks) and line i always belongs to block (i / THREADS) %
//     BLOCKS, whatever the count, so a block's acknowledgement covers exactly the lines that
//     the same block index writes next time; the grid is small, so all of it is resident
//     together even when the ranks share a GPU.
constexpr int BLOCKS = 8;
constexpr int THREADS = 512;
constexpr size_t MAX_COUNT = (size_t)1 << 20;   // floats per message (the task's largest)
constexpr size_t SLOT_LINES = MAX_COUNT / 2;    // 16-byte lines per slot

struct Line {
  uint64_t lo, hi;  // each half: flag << 32 | data bits
};

struct Workspace {
  Line slot[2][SLOT_LINES];  // written by the left neighbour (2 x 8 MiB)
  uint32_t ack[BLOCKS];      // written by the right neighbour: the last call whose lines of
                             // this block index it has read
};

struct Args {
  const float* src;   // own sendbuf
  float* dst;         // own recvbuf
  Workspace* own;     // lines arrive here; acks from the right neighbour arrive here
  Workspace* right;   // where this rank's lines go
  Workspace* left;    // where this rank's acks go
  size_t count;
  uint32_t epoch;
};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void store_line(Line* p, uint64_t lo, uint64_t hi) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}

__device__ __forceinline__ void load_line(const Line* p, uint64_t& lo, uint64_t& hi) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(p) : "memory");
}

__global__ void __launch_bounds__(THREADS) ll_ring(const Args a) {
  const uint32_t e = a.epoch;
  const uint32_t mark = e;  // the flag of this call's lines
  const int s = (int)(e & 1u);
  const size_t lines = (a.count + 1) / 2;
  const size_t first = (size_t)blockIdx.x * THREADS + threadIdx.x;
  const size_t stride = (size_t)BLOCKS * THREADS;

  // 1. credit: the right neighbour has read this block's lines of slot s (call e - 2)
  if (threadIdx.x == 0 && e > 2) {
    const uint32_t need = e - 2;
    while ((int32_t)(ld_acquire_sys(&a.own->ack[blockIdx.x]) - need) < 0) {
    }
  }
  __syncthreads();

  // 2. send: one 16-byte store per line into the right neighbour's slot
  Line* out = a.right->slot[s];
  const uint64_t flag = (uint64_t)mark << 32;
  for (size_t i = first; i < lines; i += stride) {
    uint32_t d0, d1 = 0;
    if (2 * i + 1 < a.count) {
      const float2 v = reinterpret_cast<const float2*>(a.src)[i];
      d0 = __float_as_uint(v.x);
      d1 = __float_as_uint(v.y);
    } else {  // the last line of an odd count: one float, the other half carries only the flag
      d0 = __float_as_uint(a.src[2 * i]);
    }
    store_line(out + i, flag | d0, flag | d1);
  }

  // 3. receive: poll each line of own slot s until both halves carry this call's flag
  const Line* in = a.own->slot[s];
  for (size_t i = first; i < lines; i += stride) {
    uint64_t lo, hi;
    do {
      load_line(in + i, lo, hi);
    } while ((uint32_t)(lo >> 32) != mark || (uint32_t)(hi >> 32) != mark);
    if (2 * i + 1 < a.count) {
      reinterpret_cast<float2*>(a.dst)[i] =
          make_float2(__uint_as_float((uint32_t)lo), __uint_as_float((uint32_t)hi));
    } else {
      a.dst[2 * i] = __uint_as_float((uint32_t)lo);
    }
  }

  // 4. acknowledge: every thread of the block has read its lines, tell the left neighbour
  __syncthreads();
  if (threadIdx.x == 0) st_release_sys(&a.left->ack[blockIdx.x], e);
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const int rank = ctx->rank;
  const int n = ctx->world_size;
  const int right = (rank + 1) % n;      // receives this rank's sendbuf
  const int left = (rank + n - 1) % n;   // sends its sendbuf to this rank
  const float* sendbuf = (const float*)ctx->buffers[0];  // count floats, input
  float* recvbuf = (float*)ctx->buffers[1];              // count floats, output
  const size_t count = ctx->buffer_bytes[0] / sizeof(float);
  void* ws = ctx->workspace;                        // this rank's workspace (zeroed once)
  void* right_ws = ctx->peer_workspace[right];      // the right neighbour's workspace (CUDA IPC)
  void* left_ws = ctx->peer_workspace[left];        // the left neighbour's workspace (CUDA IPC)
  const size_t ws_bytes = ctx->workspace_bytes;     // the same on every rank
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT launch
  if (count > MAX_COUNT || ws_bytes < sizeof(Workspace)) return 2;
  if (count == 0) return 0;   // the same on every rank: nobody sends, nobody waits
  static uint32_t epoch = 0;  // calls so far: every rank makes the same calls
  Args a;
  a.src = sendbuf;
  a.dst = recvbuf;
  a.own = (Workspace*)ws;
  a.right = (Workspace*)right_ws;
  a.left = (Workspace*)left_ws;
  a.count = count;
  a.epoch = ++epoch;
  ll_ring<<<BLOCKS, THREADS, 0, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
