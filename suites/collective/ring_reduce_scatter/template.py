"""Ring reduce-scatter (sum) over ctx.comm, from point-to-point messages only."""

import numpy as np
from mpi4py import MPI


def reduce_scatter(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT reduce_scatter
    raise NotImplementedError("write the ring reduce-scatter here")
    # <<< COMMBENCH EDIT
