"""Broadcast from ctx.root over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def bcast(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    root: int = ctx.root
    # >>> COMMBENCH EDIT bcast
    # mutant: the root sends its data but never fills its own recvbuf
    n, rank = comm.Get_size(), comm.Get_rank()
    vrank = (rank - root) % n
    mask = 1
    while mask < n:
        if vrank & mask:
            comm.Recv(recvbuf, source=(rank - mask) % n, tag=11)
            break
        mask <<= 1
    data = sendbuf if vrank == 0 else recvbuf
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            comm.Send(data, dest=(rank + mask) % n, tag=11)
        mask >>= 1
    # <<< COMMBENCH EDIT
