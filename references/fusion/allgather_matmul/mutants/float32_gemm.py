"""All-gather of A's row shards fused with the matmul C = A @ B, overlapping the two."""

import numpy as np
from mpi4py import MPI


def allgather_matmul(ctx, a_shard: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather_matmul
    # mutant: multiplies in float32 to halve the bytes and double the flops: too imprecise
    world, rank = comm.Get_size(), comm.Get_rank()
    m, k = a_shard.shape
    a_full = np.empty((world * m, k), dtype=np.float32)
    comm.Allgather(a_shard.astype(np.float32), a_full)
    c[:] = a_full @ b.astype(np.float32)
    # <<< COMMBENCH EDIT
