"""Node-local topology of ctx.comm, from the host every rank runs on."""

import numpy as np
from mpi4py import MPI


def host_topology(ctx, topo: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT host_topology
    # mutant: local rank = rank % local_size, right only when ranks fill hosts in blocks
    world, rank = comm.Get_size(), comm.Get_rank()
    hosts = comm.allgather(ctx.hostname)
    me = hosts[rank]
    peers = [r for r in range(world) if hosts[r] == me]
    order = list(dict.fromkeys(hosts))  # hosts in order of their lowest rank
    topo[:] = (rank % len(peers), len(peers), order.index(me), peers[0])
    # <<< COMMBENCH EDIT
