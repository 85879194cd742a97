// A host-to-device FIFO: the host pushes work items (chunks of x) into a bounded queue in
// pinned, mapped host memory; a persistent kernel pops them, computes out = 2 * x + 1 over
// each chunk and hands the slots back.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT fifo
// Design:
//   - the queue: CAP slots in pinned host memory mapped into the device. Item t (numbered
//     from 0 over the whole run) goes to slot t % CAP: the host writes {offset, length},
//     then `seq` = t + 1 (a release store), so a reader that waits for exactly t + 1 never
//     reads a half-written or an old item. `freed[slot]` (written by the device) says which
//     item was last read out of the slot: the host refills slot t % CAP only once item
//     t - CAP has been read (credits per slot, in any order);
//   - the kernel: a small persistent grid. Thread 0 of a block claims the next item number
//     with an atomicAdd on a device counter that lives for the whole run, waits for the
//     item, copies it out, frees the slot and shares it with the block, which processes the
//     chunk (16-byte vectors, then the chunk's last length % 4 elements); a sentinel item
//     (length STOP) ends the block. The host pushes one sentinel per block after the chunks,
//     so every block ends on exactly one sentinel and the device counter stays equal to the
//     host's count of items pushed when the kernel ends.
#include <sched.h>
#include <string.h>

constexpr int CAP = 64;                       // queue slots
constexpr uint64_t CHUNK = 16384;             // floats per work item (a multiple of 4)
constexpr uint64_t STOP = ~(uint64_t)0;       // the length of a sentinel
constexpr int THREADS = 512;
constexpr int MAX_BLOCKS = 32;

struct Item {       // written by the host
  uint64_t offset;  // first element of the chunk
  uint64_t length;  // elements, or STOP
  uint64_t seq;     // 1 + the item's number, written last
  uint64_t pad;
};

struct Queue {  // pinned, mapped
  Item item[CAP];
  uint64_t freed[CAP];  // device -> host: 1 + the number of the last item read from the slot
};

__device__ unsigned long long g_claimed = 0;  // items claimed so far (the whole run)

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__global__ void __launch_bounds__(THREADS)
worker(const float* __restrict__ x, float* __restrict__ out, Queue* q) {
  __shared__ uint64_t s_off, s_len;
  for (;;) {
    if (threadIdx.x == 0) {
      const unsigned long long t = atomicAdd(&g_claimed, 1ull);
      Item* it = &q->item[t % CAP];
      while (ld_acquire_sys(&it->seq) != t + 1) {
      }
      const uint64_t off = *(volatile uint64_t*)&it->offset;
      const uint64_t len = *(volatile uint64_t*)&it->length;
      st_release_sys(&q->freed[t % CAP], t + 1);  // read out: the host may refill the slot
      s_off = off;
      s_len = len;
    }
    __syncthreads();
    const uint64_t off = s_off, len = s_len;
    if (len == STOP) break;  // the same for the whole block
    const float* xs = x + off;
    float* os = out + off;
    const uint64_t vecs = len / 4;  // off is a multiple of CHUNK: 16-byte aligned
    for (uint64_t v = threadIdx.x; v < vecs; v += THREADS) {
      float4 a = reinterpret_cast<const float4*>(xs)[v];
      a.x = 2.0f * a.x + 1.0f;
      a.y = 2.0f * a.y + 1.0f;
      a.z = 2.0f * a.z + 1.0f;
      a.w = 2.0f * a.w + 1.0f;
      reinterpret_cast<float4*>(os)[v] = a;
    }
    for (uint64_t i = vecs * 4 + threadIdx.x; i < len; i += THREADS) os[i] = 2.0f * xs[i] + 1.0f;
    __syncthreads();  // s_off / s_len are rewritten next round
  }
}

static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const float* x = (const float*)ctx->buffers[0];  // n floats, input
  float* out = (float*)ctx->buffers[1];            // n floats, output
  const size_t n = ctx->buffer_bytes[0] / sizeof(float);
  const int device = ctx->device;                  // already current
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  if (n == 0) return 0;
  static Queue* q = nullptr;      // host view
  static Queue* q_dev = nullptr;  // device view
  static uint64_t pushed = 0;     // items pushed by earlier calls
  static int blocks = 0;
  if (!q) {
    if (cudaHostAlloc((void**)&q, sizeof(Queue), cudaHostAllocMapped) != cudaSuccess) return 3;
    memset(q, 0, sizeof(Queue));
    if (cudaHostGetDevicePointer((void**)&q_dev, q, 0) != cudaSuccess) return 3;
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return 3;
    blocks = sms < MAX_BLOCKS ? sms : MAX_BLOCKS;
    if (blocks < 1) blocks = 1;
  }
  worker<<<blocks, THREADS, 0, stream>>>(x, out, q_dev);
  if (cudaGetLastError() != cudaSuccess) return 1;

  const uint64_t items = (n + CHUNK - 1) / CHUNK;
  const uint64_t total = items + (uint64_t)blocks;  // the chunks, then one sentinel per block
  unsigned long long idle = 0;
  for (uint64_t j = 0; j < total; ++j) {
    const uint64_t t = pushed + j;
    Item* it = &q->item[t % CAP];
    if (t >= CAP) {  // the slot's previous item, t - CAP, must have been read out
      while (__atomic_load_n(&q->freed[t % CAP], __ATOMIC_ACQUIRE) < t - CAP + 1) {
        cpu_relax();
        if ((++idle & ((1u << 20) - 1)) == 0) {  // now and then: has the kernel failed?
          const cudaError_t e = cudaStreamQuery(stream);
          if (e != cudaSuccess && e != cudaErrorNotReady) return 6;
        }
      }
    }
    uint64_t off = 0, len = STOP;
    if (j < items) {
      off = j * CHUNK;
      len = n - off < CHUNK ? n - off : CHUNK;
    }
    __atomic_store_n(&it->offset, off, __ATOMIC_RELAXED);
    __atomic_store_n(&it->length, len, __ATOMIC_RELAXED);
    __atomic_store_n(&it->seq, t + 1, __ATOMIC_RELEASE);
  }
  pushed += total;
  return 0;
  // <<< COMMBENCH EDIT
}
