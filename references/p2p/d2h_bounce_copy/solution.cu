// out = x, both in device memory, every byte staged through pinned host memory: chunks go
// device -> host -> device on the copy engines, the two directions overlapped.
#include <cuda_runtime.h>
#include <stdint.h>

#include "commbench.h"

// >>> COMMBENCH EDIT helpers
// Chunk i of the buffer goes through staging slot i % kSlots (pinned host memory):
//   ctx->stream:  [wait: slot drained]  x chunk -> slot (D2H)  [record: landed[slot]]
//   up stream:    [wait: landed[slot]]  slot -> out chunk (H2D)  [record: drained[slot]]
// The device-to-host engine runs ahead into the next slots while the host-to-device engine
// empties the earlier ones, so both directions move at once; a slot is refilled only once
// its previous chunk has left (drained). Events are reused: a wait always refers to the
// event's latest record, made earlier in host order. The call ends on ctx->stream, which
// waits for the last host-to-device copy, and the next call's copies queue behind it.
constexpr size_t kChunk = (size_t)2 << 20;  // 2 MiB per slot
constexpr int kSlots = 4;                   // 8 MiB of pinned staging in all

struct Bounce {
  uint8_t* staging = nullptr;  // kSlots * kChunk bytes of pinned host memory, kept for good
  cudaStream_t up = nullptr;   // the host -> device copies
  cudaEvent_t landed[kSlots];  // slot s holds its chunk (device -> host done)
  cudaEvent_t drained[kSlots]; // slot s has been copied out (host -> device done)
  bool used[kSlots] = {};      // drained[s] has been recorded at least once
  cudaEvent_t done;            // the last host -> device copy of a call
  bool ready = false;
};

static int bounce_setup(Bounce& b) {
  if (cudaHostAlloc((void**)&b.staging, (size_t)kSlots * kChunk, cudaHostAllocDefault) !=
      cudaSuccess)
    return 2;
  if (cudaStreamCreateWithFlags(&b.up, cudaStreamNonBlocking) != cudaSuccess) return 3;
  for (int s = 0; s < kSlots; ++s) {
    if (cudaEventCreateWithFlags(&b.landed[s], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&b.drained[s], cudaEventDisableTiming) != cudaSuccess)
      return 4;
  }
  if (cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess) return 4;
  b.ready = true;
  return 0;
}

#define BOUNCE_CHECK(call)                   \
  do {                                       \
    if ((call) != cudaSuccess) return 5;     \
  } while (0)
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const uint8_t* x = (const uint8_t*)ctx->buffers[0];  // n bytes of device memory (input)
  uint8_t* out = (uint8_t*)ctx->buffers[1];            // n bytes of device memory (output)
  const size_t n = ctx->buffer_bytes[0];
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT run
  static Bounce b;
  if (!b.ready) {
    const int rc = bounce_setup(b);
    if (rc != 0) return rc;
  }
  if (n == 0) return 0;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  for (size_t i = 0; i < chunks; ++i) {
    const int s = (int)(i % kSlots);
    const size_t off = i * kChunk;
    const size_t len = n - off < kChunk ? n - off : kChunk;
    uint8_t* slot = b.staging + (size_t)s * kChunk;
    // the slot's previous chunk (this call's or an earlier call's) must have left it
    if (b.used[s]) BOUNCE_CHECK(cudaStreamWaitEvent(stream, b.drained[s], 0));
    BOUNCE_CHECK(cudaMemcpyAsync(slot, x + off, len, cudaMemcpyDeviceToHost, stream));
    BOUNCE_CHECK(cudaEventRecord(b.landed[s], stream));
    BOUNCE_CHECK(cudaStreamWaitEvent(b.up, b.landed[s], 0));
    BOUNCE_CHECK(cudaMemcpyAsync(out + off, slot, len, cudaMemcpyHostToDevice, b.up));
    BOUNCE_CHECK(cudaEventRecord(b.drained[s], b.up));
    b.used[s] = true;
  }
  // the call's work ends on ctx->stream
  BOUNCE_CHECK(cudaEventRecord(b.done, b.up));
  BOUNCE_CHECK(cudaStreamWaitEvent(stream, b.done, 0));
  return 0;
  // <<< COMMBENCH EDIT
}
