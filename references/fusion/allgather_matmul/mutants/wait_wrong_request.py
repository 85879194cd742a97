"""All-gather of A's row shards fused with the matmul C = A @ B, overlapping the two."""

import numpy as np
from mpi4py import MPI


def allgather_matmul(ctx, a_shard: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather_matmul
    # mutant: waits on the send instead of the receive, so the next step multiplies (and
    # forwards) a chunk that has not arrived yet
    world, rank = comm.Get_size(), comm.Get_rank()
    m = a_shard.shape[0]
    right, left = (rank + 1) % world, (rank - 1) % world
    cur = np.ascontiguousarray(a_shard).copy()
    nxt = np.empty_like(cur)
    pending = []
    for step in range(world):
        owner = (rank - step) % world  # cur holds the rows of this rank
        if step < world - 1:
            pending.append(comm.Irecv(nxt, source=left, tag=step))
            send = comm.Isend(cur, dest=right, tag=step)
        np.matmul(cur, b, out=c[owner * m:(owner + 1) * m])
        if step < world - 1:
            send.Wait()
            cur, nxt = nxt, cur
    MPI.Request.Waitall(pending)
    # <<< COMMBENCH EDIT
