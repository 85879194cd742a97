// Reduce-scatter (sum, float32) with NCCL on user buffers that are registered with the
// communicator once (ncclCommRegister) and deregistered once they are gone.
#include <cuda_runtime.h>
#include <nccl.h>

#include "commbench.h"

// >>> COMMBENCH EDIT registration
// A registration cache keyed by address. ncclCommRegister is local (no other rank takes part)
// and NCCL looks a registered buffer up by its address range in every later operation, so a
// registration must never outlive its buffer: a new buffer at a freed one's address would
// find the old registration. What the harness guarantees (see the prompt): a call whose
// buffers are new is a set-up call (the host helpers work there and nowhere else); the
// set-up calls of one generation of buffers come one after another, and a set-up call that
// follows an ordinary call starts a new generation, all earlier buffers gone. So: drop every
// registration there; in any set-up call, drop whatever overlaps the new buffers (two live
// buffers never overlap) and register them.
#include <vector>

namespace {

struct Registration {
  ncclComm_t comm;
  const char* ptr;
  size_t bytes;
  void* handle;  // NULL where NCCL skipped the registration (deregistering it is a no-op)
};

std::vector<Registration> g_regs;
bool g_last_setup = false;  // whether the previous call was a set-up call

int drop(size_t i) {
  ncclResult_t rc = ncclCommDeregister(g_regs[i].comm, g_regs[i].handle);
  g_regs.erase(g_regs.begin() + (long)i);
  return rc == ncclSuccess ? 0 : (int)rc;
}

int drop_all() {
  int err = 0;
  while (!g_regs.empty()) {
    int rc = drop(g_regs.size() - 1);
    if (rc && !err) err = rc;
  }
  return err;
}

// Registers [buf, buf + bytes) after dropping every registration that overlaps it.
int register_new(ncclComm_t comm, void* buf, size_t bytes) {
  const char* lo = (const char*)buf;
  const char* hi = lo + bytes;
  int err = 0;
  for (size_t i = g_regs.size(); i-- > 0;) {
    const Registration& r = g_regs[i];
    if (r.ptr < hi && lo < r.ptr + r.bytes) {
      int rc = drop(i);
      if (rc && !err) err = rc;
    }
  }
  if (err) return err;
  void* handle = nullptr;
  ncclResult_t rc = ncclCommRegister(comm, buf, bytes, &handle);
  if (rc != ncclSuccess) return (int)rc;
  g_regs.push_back({comm, lo, bytes, handle});
  return 0;
}

// Registered as it is (same communicator, address and size)? Else registers it now.
int ensure(ncclComm_t comm, void* buf, size_t bytes) {
  for (const Registration& r : g_regs)
    if (r.comm == comm && r.ptr == (const char*)buf && r.bytes == bytes) return 0;
  return register_new(comm, buf, bytes);
}

}  // namespace
// <<< COMMBENCH EDIT

extern "C" int commbench_run(const commbench_ctx* ctx) {
  float* sendbuf = (float*)ctx->buffers[0];       // world_size blocks, one per rank
  float* recvbuf = (float*)ctx->buffers[1];       // this rank's block of the sum
  const size_t send_bytes = ctx->buffer_bytes[0];
  const size_t recv_bytes = ctx->buffer_bytes[1];
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t stream = (cudaStream_t)ctx->stream;
  // >>> COMMBENCH EDIT reduce_scatter
  const int world = ctx->world_size;
  const size_t recvcount = recv_bytes / sizeof(float);  // elements of this rank's block
  if (world < 1 || send_bytes != recv_bytes * (size_t)world) return 2;
  // the host helpers answer 0 in a set-up call and 2 (doing nothing) in any other call
  const int host = ctx->barrier(ctx->host);
  if (host != 0 && host != 2) return 3;
  const bool setup = host == 0;
  int err = 0;
  if (setup) {
    if (!g_last_setup) err = drop_all();  // a new generation: every earlier buffer is gone
    if (!err) err = register_new(comm, sendbuf, send_bytes);
    if (!err) err = register_new(comm, recvbuf, recv_bytes);
  } else {  // buffers seen in their set-up call: registered already
    err = ensure(comm, sendbuf, send_bytes);
    if (!err) err = ensure(comm, recvbuf, recv_bytes);
  }
  g_last_setup = setup;
  if (err) return err;
  ncclResult_t rc = ncclReduceScatter(sendbuf, recvbuf, recvcount, ncclFloat32, ncclSum, comm,
                                      stream);
  return rc == ncclSuccess ? 0 : (int)rc;
  // <<< COMMBENCH EDIT
}
