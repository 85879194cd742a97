"""MoE expert-parallel dispatch: send every token to each rank that hosts one of its experts."""

import numpy as np
from mpi4py import MPI


def moe_dispatch(ctx, x: np.ndarray, topk_idx: np.ndarray, num_experts: int,
                 recv_x: np.ndarray, recv_src: np.ndarray, num_recv: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT dispatch
    # mutant: tokens for this rank's own experts skip MPI and are appended after the received
    # ones, instead of at their source rank's place in the order
    world, rank = comm.Get_size(), comm.Get_rank()
    tokens = x.shape[0]
    row = x.shape[1]
    per_rank = num_experts // world
    hit = np.zeros((world, tokens), dtype=bool)
    hit[topk_idx // per_rank, np.arange(tokens)[:, None]] = True
    local = np.flatnonzero(hit[rank])
    hit[rank] = False  # nothing to send to ourselves
    send_map = np.packbits(hit, axis=1)
    recv_map = np.empty_like(send_map)
    comm.Alltoall(send_map, recv_map)
    got = np.unpackbits(recv_map, axis=1, count=tokens).view(bool)
    src, tok = np.nonzero(got)
    m = src.size
    _, send_tok = np.nonzero(hit)
    comm.Alltoallv([x[send_tok], hit.sum(axis=1) * row], [recv_x[:m], got.sum(axis=1) * row])
    recv_src[:m, 0] = src
    recv_src[:m, 1] = tok
    n = m + local.size
    recv_x[m:n] = x[local]
    recv_src[m:n, 0] = rank
    recv_src[m:n, 1] = local
    num_recv[0] = n
    # <<< COMMBENCH EDIT
