"""Broadcast from ctx.root over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def bcast(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    root: int = ctx.root
    # >>> COMMBENCH EDIT bcast
    # mutant: inner tree nodes forward their own sendbuf instead of the data they received
    n, rank = comm.Get_size(), comm.Get_rank()
    vrank = (rank - root) % n
    mask = 1
    while mask < n:
        if vrank & mask:
            comm.Recv(recvbuf, source=(rank - mask) % n, tag=11)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            comm.Send(sendbuf, dest=(rank + mask) % n, tag=11)
        mask >>= 1
    if vrank == 0:
        recvbuf[:] = sendbuf
    # <<< COMMBENCH EDIT
