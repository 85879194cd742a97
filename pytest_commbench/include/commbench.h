// pytest-commbench: the C ABI between the harness and a compiled solution.
//
// The harness (Python, one process per rank) allocates every buffer, creates the NCCL
// communicator and maps the peers' buffers through CUDA IPC, then calls
//
//     extern "C" int commbench_run(const commbench_ctx* ctx);
//
// on every rank at once, many times. Return 0 on success; anything else is a runtime error.
// All work must be finished or enqueued on ctx->stream (or any stream: the harness waits for
// the whole device) when the call returns. State that must outlive a call (registered
// buffers, flags, a call counter) may live in static variables of the solution.
#ifndef COMMBENCH_H
#define COMMBENCH_H

#include <stddef.h>
#include <stdint.h>

#define COMMBENCH_MAX_RANKS 16
#define COMMBENCH_MAX_BUFFERS 8
#define COMMBENCH_MAX_PARAMS 8

#ifdef __cplusplus
extern "C" {
#endif

typedef struct commbench_ctx {
  int rank;        // this rank, 0 .. world_size-1
  int world_size;  // number of ranks (one GPU each)
  int local_rank;  // rank within this host
  int device;      // the CUDA device this rank uses (already current)
  void* stream;    // cudaStream_t for the solution's work
  void* nccl_comm; // ncclComm_t of all ranks, or NULL when the task does not ask for NCCL

  // the task's buffers, in the order its prompt lists them (device memory)
  int num_buffers;
  void* buffers[COMMBENCH_MAX_BUFFERS];
  size_t buffer_bytes[COMMBENCH_MAX_BUFFERS];
  // peer_buffers[r][i]: rank r's buffer i mapped into this process through CUDA IPC
  // (peer_buffers[rank][i] == buffers[i]); NULL when the task does not ask for IPC
  void* peer_buffers[COMMBENCH_MAX_RANKS][COMMBENCH_MAX_BUFFERS];

  // a device workspace of workspace_bytes on every rank, zeroed once before the first call,
  // and every rank's workspace mapped through CUDA IPC (flags, staging, signals)
  void* workspace;
  size_t workspace_bytes;
  void* peer_workspace[COMMBENCH_MAX_RANKS];

  // the task's scalar parameters, in the order its prompt lists them
  int num_params;
  int64_t params[COMMBENCH_MAX_PARAMS];

  // host-side helpers over the harness's own MPI communicator (for exchanging handles and
  // ids during set-up; they synchronize the host only). Each returns 0 on success. They work
  // in a set-up call (the first call of a case, whose buffers are new) and carry at most
  // 4096 bytes per rank and call; elsewhere they return 2 and do nothing (a task whose
  // answer is host data, such as a topology, may use them in every call: its prompt says so).
  void* host;
  int (*allgather)(void* host, const void* send, size_t bytes, void* recv);
  int (*broadcast)(void* host, void* buf, size_t bytes, int root);
  int (*barrier)(void* host);
} commbench_ctx;

int commbench_run(const commbench_ctx* ctx);

#ifdef __cplusplus
}
#endif

#endif  // COMMBENCH_H
