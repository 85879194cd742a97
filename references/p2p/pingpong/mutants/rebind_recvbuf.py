"""Ping-pong between ranks 0 and 1 of ctx.comm: one round trip per call."""

import numpy as np
from mpi4py import MPI


def pingpong(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT pingpong
    # mutant: pickle-based send/recv; the received array is bound to the local name only
    rank = comm.Get_rank()
    if rank == 0:
        comm.send(sendbuf, dest=1, tag=0)
        recvbuf = comm.recv(source=1, tag=1)
    elif rank == 1:
        recvbuf = comm.recv(source=0, tag=0)
        comm.send(sendbuf, dest=0, tag=1)
    # <<< COMMBENCH EDIT
