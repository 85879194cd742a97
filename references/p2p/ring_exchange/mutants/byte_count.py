"""Ring exchange over ctx.comm: every rank sends to its right neighbour, receives from its left."""

import numpy as np
from mpi4py import MPI


def ring_exchange(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT ring_exchange
    # mutant: gives the element count with MPI.BYTE: only count bytes of count * 8 are moved
    n, rank = comm.Get_size(), comm.Get_rank()
    count = sendbuf.size
    reqs = [comm.Irecv([recvbuf, count, MPI.BYTE], source=(rank - 1) % n, tag=0),
            comm.Isend([sendbuf, count, MPI.BYTE], dest=(rank + 1) % n, tag=0)]
    MPI.Request.Waitall(reqs)
    # <<< COMMBENCH EDIT
