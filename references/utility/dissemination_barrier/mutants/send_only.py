"""A barrier over ctx.comm from point-to-point messages."""

import numpy as np
from mpi4py import MPI


def barrier(ctx) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT barrier
    # mutant: never waits for the last round's message
    n, rank = comm.Get_size(), comm.Get_rank()
    token = np.zeros(1, dtype=np.uint8)
    got = np.empty(1, dtype=np.uint8)
    distance, k = 1, 0
    while distance < n:
        # messages between a pair are non-overtaking, so round tags keep calls apart
        req = comm.Irecv(got, source=(rank - distance) % n, tag=k)
        comm.Send(token, dest=(rank + distance) % n, tag=k)
        if distance * 2 >= n:
            req.Free()  # does not wait for the last round's message
        else:
            req.Wait()
        distance *= 2
        k += 1
    # <<< COMMBENCH EDIT
