"""All-gather over ctx.comm by recursive doubling, from point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def allgather(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather
    n, rank = comm.Get_size(), comm.Get_rank()
    count = sendbuf.size
    recvbuf[rank * count:(rank + 1) * count] = sendbuf
    if n == 1:
        return
    if n & (n - 1) == 0:
        # recursive doubling: before the step with distance `mask`, this rank holds the `mask`
        # blocks of its aligned group [rank & ~(mask - 1), ... + mask), contiguous in recvbuf;
        # the partner's group is the neighbouring aligned group of the same size
        mask = 1
        while mask < n:
            partner = rank ^ mask
            mine = rank & ~(mask - 1)
            theirs = partner & ~(mask - 1)
            comm.Sendrecv(recvbuf[mine * count:(mine + mask) * count], dest=partner,
                          sendtag=mask,
                          recvbuf=recvbuf[theirs * count:(theirs + mask) * count],
                          source=partner, recvtag=mask)
            mask <<= 1
    else:
        # any other world size: a ring, one block per step in n - 1 steps
        right, left = (rank + 1) % n, (rank - 1) % n
        for step in range(n - 1):
            s, r = (rank - step) % n, (rank - step - 1) % n
            comm.Sendrecv(recvbuf[s * count:(s + 1) * count], dest=right, sendtag=step,
                          recvbuf=recvbuf[r * count:(r + 1) * count], source=left,
                          recvtag=step)
    # <<< COMMBENCH EDIT
