"""A barrier over ctx.comm from point-to-point messages."""

import numpy as np
from mpi4py import MPI


def barrier(ctx) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT barrier
    # mutant: the root releases the others before it has heard from them
    n, rank = comm.Get_size(), comm.Get_rank()
    token = np.zeros(1, dtype=np.uint8)
    got = np.empty(1, dtype=np.uint8)
    # gather-release at rank 0, but rank 0 does not wait for anyone before releasing
    if rank == 0:
        for peer in range(1, n):
            comm.Send(token, dest=peer, tag=1)
        for peer in range(1, n):
            comm.Recv(got, source=peer, tag=0)
    else:
        comm.Send(token, dest=0, tag=0)
        comm.Recv(got, source=0, tag=1)
    # <<< COMMBENCH EDIT
