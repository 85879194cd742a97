"""MoE expert-parallel dispatch: send every token to each rank that hosts one of its experts."""

import numpy as np
from mpi4py import MPI


def moe_dispatch(ctx, x: np.ndarray, topk_idx: np.ndarray, num_experts: int,
                 recv_x: np.ndarray, recv_src: np.ndarray, num_recv: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT dispatch
    # mutant: one copy per selected expert, not per destination rank: a token with two experts
    # on the same rank arrives there twice
    world = comm.Get_size()
    tokens, row = x.shape
    topk = topk_idx.shape[1]
    per_rank = num_experts // world
    dest = (topk_idx // per_rank).reshape(-1)
    tok = np.repeat(np.arange(tokens, dtype=np.int64), topk)
    order = np.lexsort((tok, dest))  # by destination, then token
    dest, tok = dest[order], tok[order]
    send_counts = np.bincount(dest, minlength=world).astype(np.int64)
    recv_counts = np.empty(world, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    n = int(recv_counts.sum())
    got_x = np.empty((n, row), dtype=x.dtype)
    comm.Alltoallv([x[tok], send_counts * row], [got_x, recv_counts * row])
    got_tok = np.empty(n, dtype=np.int64)
    comm.Alltoallv([tok, send_counts], [got_tok, recv_counts])
    n = min(n, recv_x.shape[0])  # never write past the capacity
    recv_x[:n] = got_x[:n]
    recv_src[:n, 0] = np.repeat(np.arange(world), recv_counts)[:n]
    recv_src[:n, 1] = got_tok[:n]
    num_recv[0] = n
    # <<< COMMBENCH EDIT
