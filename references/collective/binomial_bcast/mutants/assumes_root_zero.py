"""Broadcast from ctx.root over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def bcast(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    root: int = ctx.root
    # >>> COMMBENCH EDIT bcast
    # mutant: builds the tree rooted at rank 0 whatever the root is
    n, rank = comm.Get_size(), comm.Get_rank()
    mask = 1
    while mask < n:
        if rank & mask:
            comm.Recv(recvbuf, source=rank - mask, tag=11)
            break
        mask <<= 1
    data = sendbuf if rank == 0 else recvbuf
    mask >>= 1
    while mask > 0:
        if rank + mask < n:
            comm.Send(data, dest=rank + mask, tag=11)
        mask >>= 1
    if rank == 0:
        recvbuf[:] = sendbuf
    # <<< COMMBENCH EDIT
