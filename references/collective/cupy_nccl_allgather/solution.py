"""All-gather of GPU buffers through NCCL, from cupy: every rank ends with all sendbufs."""

import cupy
from cupy.cuda import nccl


def allgather(ctx, sendbuf: cupy.ndarray, recvbuf: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather
    # one NCCL all-gather straight from sendbuf into recvbuf, queued on the harness's stream;
    # NCCL's count is the elements each rank contributes
    comm.allGather(sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, nccl.NCCL_FLOAT32,
                   stream.ptr)
    # <<< COMMBENCH EDIT
