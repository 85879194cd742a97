"""Node-local topology of ctx.comm, from the host every rank runs on."""

import numpy as np
from mpi4py import MPI


def host_topology(ctx, topo: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT host_topology
    # mutant: numbers the hosts in sorted name order instead of by their lowest rank
    world, rank = comm.Get_size(), comm.Get_rank()
    hosts = comm.allgather(ctx.hostname)
    me = hosts[rank]
    peers = [r for r in range(world) if hosts[r] == me]
    node_index = sorted(set(hosts)).index(me)
    topo[:] = (peers.index(rank), len(peers), node_index, peers[0])
    # <<< COMMBENCH EDIT
