"""All-gather of A's row shards fused with the matmul C = A @ B, overlapping the two."""

import numpy as np
from mpi4py import MPI


def allgather_matmul(ctx, a_shard: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT allgather_matmul
    raise NotImplementedError("gather A and multiply it by b here, overlapping the two")
    # <<< COMMBENCH EDIT
