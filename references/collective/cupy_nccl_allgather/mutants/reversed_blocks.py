"""All-gather of GPU buffers through NCCL, from cupy: every rank ends with all sendbufs."""

import cupy
from cupy.cuda import nccl


def allgather(ctx, sendbuf: cupy.ndarray, recvbuf: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather
    # mutant: gathers into a staging buffer, then copies it back with the blocks in reverse
    # rank order (recvbuf block r gets rank world - 1 - r's data)
    world, count = ctx.world_size, sendbuf.size
    with stream:
        staging = cupy.empty((world, count), dtype=cupy.float32)
        comm.allGather(sendbuf.data.ptr, staging.data.ptr, count, nccl.NCCL_FLOAT32,
                       stream.ptr)
        recvbuf.reshape(world, count)[...] = staging[::-1]
    # <<< COMMBENCH EDIT
