// pytest-commbench: RCCL on an NVIDIA GPU (platform h200-hip) is NCCL: the same API by name
// (ncclComm_t, ncclAllReduce, ...), hipStream_t being cudaStream_t here. RCCL's additions
// that NCCL lacks (ncclAllToAll, gather, scatter) are not here: a task that needs them is
// written for AMD only.
#ifndef COMMBENCH_RCCL_ON_NCCL_H
#define COMMBENCH_RCCL_ON_NCCL_H
#include <hip/hip_runtime.h>
#include <nccl.h>
#endif
