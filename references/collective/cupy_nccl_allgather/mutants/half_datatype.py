"""All-gather of GPU buffers through NCCL, from cupy: every rank ends with all sendbufs."""

import cupy
from cupy.cuda import nccl


def allgather(ctx, sendbuf: cupy.ndarray, recvbuf: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather
    # mutant: the datatype constant is NCCL_FLOAT16 (copied from a half-precision example):
    # NCCL moves count * 2 bytes per rank, so every block is half as long and misplaced
    comm.allGather(sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, nccl.NCCL_FLOAT16,
                   stream.ptr)
    # <<< COMMBENCH EDIT
