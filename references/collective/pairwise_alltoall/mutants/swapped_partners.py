"""Pairwise all-to-all exchange over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def alltoall(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT alltoall
    # mutant: sends to (rank - k) and receives from (rank + k), keeping the (rank + k) block
    # and (rank - k) slot: blocks arrive at the wrong rank and land in the wrong slot
    n, rank = comm.Get_size(), comm.Get_rank()
    count = sendbuf.size // n
    send = sendbuf.reshape(n, count)  # row j: the block for rank j (a view, no copy)
    recv = recvbuf.reshape(n, count)  # row i: the block from rank i
    recv[rank] = send[rank]
    for k in range(1, n):
        dst, src = (rank + k) % n, (rank - k) % n
        comm.Sendrecv(send[dst], dest=src, sendtag=k, recvbuf=recv[src], source=dst, recvtag=k)
    # <<< COMMBENCH EDIT
