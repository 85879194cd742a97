// Push this rank's sendbuf into the next rank's recvbuf with a copy of the HIP runtime: on an
// MI325X node a copy between two GPUs is carried over xGMI by a copy engine (SDMA).
#include <hip/hip_runtime.h>

#include "commbench.h"

extern "C" int commbench_run(const commbench_ctx* ctx) {
  const void* src = ctx->buffers[0];                      // this rank's sendbuf
  const size_t bytes = ctx->buffer_bytes[0];              // 4 B .. 256 MiB
  const int next = (ctx->rank + 1) % ctx->world_size;
  void* dst = ctx->peer_buffers[next][1];                 // the next rank's recvbuf (HIP IPC)
  hipStream_t stream = (hipStream_t)ctx->stream;
  // >>> COMMBENCH EDIT copy
  // A single asynchronous device-to-device copy, enqueued on the harness's stream. The runtime
  // looks up both addresses (the peer's recvbuf is a HIP IPC mapping it made, so it knows the
  // GPU behind it) and hands a copy to another GPU to its copy machinery, which streams it
  // over the xGMI link while the compute units stay idle. No device ordinal of the peer is
  // needed, unlike hipMemcpyPeerAsync, and the call returns as soon as the copy is queued.
  const hipError_t err = hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, stream);
  return err == hipSuccess ? 0 : 1;
  // <<< COMMBENCH EDIT
}
