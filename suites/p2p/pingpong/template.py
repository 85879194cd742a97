"""Ping-pong between ranks 0 and 1 of ctx.comm: one round trip per call."""

import numpy as np
from mpi4py import MPI


def pingpong(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT pingpong
    raise NotImplementedError("write the ping-pong here")
    # <<< COMMBENCH EDIT
