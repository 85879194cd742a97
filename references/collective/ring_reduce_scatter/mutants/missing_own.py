"""Ring reduce-scatter (sum) over ctx.comm, from point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def reduce_scatter(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT reduce_scatter
    # mutant: the last step receives into recvbuf but never adds this rank's own contribution
    n, rank = comm.Get_size(), comm.Get_rank()
    count = recvbuf.size
    if n == 1:
        recvbuf[:] = sendbuf
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    bufs = (np.empty(count, dtype=recvbuf.dtype), np.empty(count, dtype=recvbuf.dtype))
    b = (rank - 1) % n
    out = sendbuf[b * count:(b + 1) * count]
    for step in range(n - 1):
        b = (rank - step - 2) % n
        if step == n - 2:
            comm.Sendrecv(out, dest=right, sendtag=step, recvbuf=recvbuf, source=left,
                          recvtag=step)
            break
        into = bufs[step % 2]
        comm.Sendrecv(out, dest=right, sendtag=step, recvbuf=into, source=left, recvtag=step)
        np.add(into, sendbuf[b * count:(b + 1) * count], out=into)
        out = into
    # <<< COMMBENCH EDIT
