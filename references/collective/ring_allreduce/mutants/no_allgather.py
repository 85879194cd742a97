"""Ring all-reduce (sum) over ctx.comm using point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def allreduce(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allreduce
    # mutant: reduce-scatter only: each rank holds one finished chunk
    n, rank = comm.Get_size(), comm.Get_rank()
    recvbuf[:] = sendbuf
    if n == 1:
        return
    count = recvbuf.size
    # chunk boundaries: the first (count % n) chunks get one extra element
    base, extra = divmod(count, n)
    bounds = [i * base + min(i, extra) for i in range(n + 1)]
    right, left = (rank + 1) % n, (rank - 1) % n
    tmp = np.empty(base + 1, dtype=recvbuf.dtype)
    # reduce-scatter: after n-1 steps rank r owns the full sum of chunk (r + 1) % n
    for step in range(n - 1):
        s = (rank - step) % n
        r = (rank - step - 1) % n
        lo, hi = bounds[r], bounds[r + 1]
        comm.Sendrecv(recvbuf[bounds[s]:bounds[s + 1]], dest=right, sendtag=step,
                      recvbuf=tmp[: hi - lo], source=left, recvtag=step)
        recvbuf[lo:hi] += tmp[: hi - lo]
    # all-gather: pass the finished chunks around the ring
    # <<< COMMBENCH EDIT
