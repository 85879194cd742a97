"""Ping-pong between ranks 0 and 1 of ctx.comm: one round trip per call."""

import numpy as np
from mpi4py import MPI


def pingpong(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT pingpong
    rank = comm.Get_rank()
    if rank == 0:
        # post the receive of the reply first: it lands straight in recvbuf, never in an
        # unexpected-message buffer
        reply = comm.Irecv(recvbuf, source=1, tag=1)
        comm.Send(sendbuf, dest=1, tag=0)
        reply.Wait()
    elif rank == 1:
        comm.Recv(recvbuf, source=0, tag=0)
        comm.Send(sendbuf, dest=0, tag=1)
    # <<< COMMBENCH EDIT
