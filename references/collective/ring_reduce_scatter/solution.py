"""Ring reduce-scatter (sum) over ctx.comm, from point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def reduce_scatter(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT reduce_scatter
    n, rank = comm.Get_size(), comm.Get_rank()
    count = recvbuf.size
    if n == 1:
        recvbuf[:] = sendbuf
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    # two partial-sum buffers, alternately received into and sent from; the last step receives
    # straight into recvbuf
    bufs = (np.empty(count, dtype=recvbuf.dtype), np.empty(count, dtype=recvbuf.dtype))
    # step s sends the partial sum of block (rank - s - 1) % n and receives that of block
    # (rank - s - 2) % n, which after the last step (s = n - 2) is this rank's own block
    b = (rank - 1) % n
    out = sendbuf[b * count:(b + 1) * count]
    for step in range(n - 1):
        b = (rank - step - 2) % n
        into = recvbuf if step == n - 2 else bufs[step % 2]
        comm.Sendrecv(out, dest=right, sendtag=step, recvbuf=into, source=left, recvtag=step)
        np.add(into, sendbuf[b * count:(b + 1) * count], out=into)
        out = into
    # <<< COMMBENCH EDIT
