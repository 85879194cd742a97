"""All-gather of A's row shards fused with the matmul C = A @ B, overlapping the two."""

import numpy as np
from mpi4py import MPI


def allgather_matmul(ctx, a_shard: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather_matmul
    # mutant: off by one in the ring: each chunk is labelled with the rank it will come from
    # next, so every block of rows lands one rank too far
    world, rank = comm.Get_size(), comm.Get_rank()
    m = a_shard.shape[0]
    right, left = (rank + 1) % world, (rank - 1) % world
    cur = np.ascontiguousarray(a_shard).copy()
    nxt = np.empty_like(cur)
    for step in range(world):
        # cur holds the rows of rank (rank - step): it has travelled `step` hops
        owner = (rank - step - 1) % world
        reqs = []
        if step < world - 1:
            reqs = [comm.Irecv(nxt, source=left, tag=step), comm.Isend(cur, dest=right, tag=step)]
        np.matmul(cur, b, out=c[owner * m:(owner + 1) * m])
        MPI.Request.Waitall(reqs)
        cur, nxt = nxt, cur
    # <<< COMMBENCH EDIT
