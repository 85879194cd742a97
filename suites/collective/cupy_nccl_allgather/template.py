"""All-gather of GPU buffers through NCCL, from cupy: every rank ends with all sendbufs."""

import cupy
from cupy.cuda import nccl


def allgather(ctx, sendbuf: cupy.ndarray, recvbuf: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather
    raise NotImplementedError("all-gather sendbuf into recvbuf with ctx.nccl here")
    # <<< COMMBENCH EDIT
