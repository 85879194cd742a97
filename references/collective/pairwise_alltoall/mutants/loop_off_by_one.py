"""Pairwise all-to-all exchange over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def alltoall(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT alltoall
    # mutant: steps 0 .. n-2 (step 0 is the local exchange) miss the last partner
    n, rank = comm.Get_size(), comm.Get_rank()
    count = sendbuf.size // n
    send = sendbuf.reshape(n, count)  # row j: the block for rank j (a view, no copy)
    recv = recvbuf.reshape(n, count)  # row i: the block from rank i
    for k in range(n - 1):
        dst, src = (rank + k) % n, (rank - k) % n
        comm.Sendrecv(send[dst], dest=dst, sendtag=k, recvbuf=recv[src], source=src, recvtag=k)
    # <<< COMMBENCH EDIT
