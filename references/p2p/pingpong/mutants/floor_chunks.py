"""Ping-pong between ranks 0 and 1 of ctx.comm: one round trip per call."""

import numpy as np
from mpi4py import MPI


def pingpong(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT pingpong
    # mutant: splits large messages into count // nchunks pieces; the remainder is never sent
    rank = comm.Get_rank()
    count = sendbuf.size
    nchunks = max(1, count // 16384)
    step = count // nchunks
    pieces = [slice(i * step, (i + 1) * step) for i in range(nchunks)]
    if rank == 0:
        for piece in pieces:
            comm.Send(sendbuf[piece], dest=1, tag=0)
        for piece in pieces:
            comm.Recv(recvbuf[piece], source=1, tag=1)
    elif rank == 1:
        for piece in pieces:
            comm.Recv(recvbuf[piece], source=0, tag=0)
        for piece in pieces:
            comm.Send(sendbuf[piece], dest=0, tag=1)
    # <<< COMMBENCH EDIT
