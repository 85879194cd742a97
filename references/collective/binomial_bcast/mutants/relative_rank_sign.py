"""Broadcast from ctx.root over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def bcast(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    root: int = ctx.root
    # >>> COMMBENCH EDIT bcast
    # mutant: relative rank rank + root (not rank - root): the tree is rooted at -root mod n
    n, rank = comm.Get_size(), comm.Get_rank()
    vrank = (rank + root) % n

    def real(v):
        return (v - root) % n

    mask = 1
    while mask < n:
        if vrank & mask:
            comm.Recv(recvbuf, source=real(vrank - mask), tag=11)
            break
        mask <<= 1
    data = sendbuf if vrank == 0 else recvbuf
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            comm.Send(data, dest=real(vrank + mask), tag=11)
        mask >>= 1
    if vrank == 0:
        recvbuf[:] = sendbuf
    # <<< COMMBENCH EDIT
