"""A barrier over ctx.comm from point-to-point messages."""

import numpy as np
from mpi4py import MPI


def barrier(ctx) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT barrier
    # mutant: a single round: right for 2 ranks only
    n, rank = comm.Get_size(), comm.Get_rank()
    token = np.zeros(1, dtype=np.uint8)
    got = np.empty(1, dtype=np.uint8)
    distance, k = 1, 0
    while distance < 2 and distance < n:
        # messages between a pair are non-overtaking, so round tags keep calls apart
        comm.Sendrecv(token, dest=(rank + distance) % n, sendtag=k,
                      recvbuf=got, source=(rank - distance) % n, recvtag=k)
        distance *= 2
        k += 1
    # <<< COMMBENCH EDIT
