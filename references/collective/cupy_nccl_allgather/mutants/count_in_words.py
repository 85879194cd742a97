"""All-gather of GPU buffers through NCCL, from cupy: every rank ends with all sendbufs."""

import cupy
from cupy.cuda import nccl


def allgather(ctx, sendbuf: cupy.ndarray, recvbuf: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather
    # mutant: the count is computed in 8-byte words (nbytes // 8) instead of float32 elements:
    # half of every block travels, to the wrong offset (and nothing at all for count = 1)
    count = sendbuf.nbytes // 8
    comm.allGather(sendbuf.data.ptr, recvbuf.data.ptr, count, nccl.NCCL_FLOAT32, stream.ptr)
    # <<< COMMBENCH EDIT
