"""Ring exchange over ctx.comm: every rank sends to its right neighbour, receives from its left."""

import numpy as np
from mpi4py import MPI


def ring_exchange(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT ring_exchange
    # mutant: a chain, not a ring: the last rank sends to nobody, rank 0 receives from nobody
    n, rank = comm.Get_size(), comm.Get_rank()
    right = rank + 1 if rank + 1 < n else MPI.PROC_NULL
    left = rank - 1 if rank > 0 else MPI.PROC_NULL
    comm.Sendrecv(sendbuf, dest=right, sendtag=0, recvbuf=recvbuf, source=left, recvtag=0)
    # <<< COMMBENCH EDIT
