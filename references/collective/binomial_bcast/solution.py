"""Broadcast from ctx.root over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def bcast(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    root: int = ctx.root
    # >>> COMMBENCH EDIT bcast
    n, rank = comm.Get_size(), comm.Get_rank()
    vrank = (rank - root) % n  # position in a binomial tree whose vrank 0 is the root
    # the parent is vrank with its lowest set bit cleared; the root has no parent
    mask = 1
    while mask < n:
        if vrank & mask:
            comm.Recv(recvbuf, source=(rank - mask) % n, tag=11)
            break
        mask <<= 1
    # forward to the children vrank + mask/2, vrank + mask/4, ... (largest subtree first)
    data = sendbuf if vrank == 0 else recvbuf
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            comm.Send(data, dest=(rank + mask) % n, tag=11)
        mask >>= 1
    if vrank == 0:
        # the root's own copy, after its children are already forwarding
        recvbuf[:] = sendbuf
    # <<< COMMBENCH EDIT
