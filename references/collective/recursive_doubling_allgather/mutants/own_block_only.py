"""All-gather over ctx.comm by recursive doubling, from point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def allgather(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather
    # mutant: exchanges only its own original block in every step, not everything gathered so far
    n, rank = comm.Get_size(), comm.Get_rank()
    count = sendbuf.size
    recvbuf[rank * count:(rank + 1) * count] = sendbuf
    mask = 1
    while mask < n:
        partner = rank ^ mask
        comm.Sendrecv(recvbuf[rank * count:(rank + 1) * count], dest=partner, sendtag=mask,
                      recvbuf=recvbuf[partner * count:(partner + 1) * count],
                      source=partner, recvtag=mask)
        mask <<= 1
    # <<< COMMBENCH EDIT
