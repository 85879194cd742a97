"""MoE expert-parallel dispatch: send every token to each rank that hosts one of its experts."""

import numpy as np
from mpi4py import MPI


def moe_dispatch(ctx, x: np.ndarray, topk_idx: np.ndarray, num_experts: int,
                 recv_x: np.ndarray, recv_src: np.ndarray, num_recv: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT dispatch
    # mutant: sends each destination its tokens grouped by expert (as an expert kernel wants
    # them), not in token order
    world = comm.Get_size()
    tokens, row = x.shape
    topk = topk_idx.shape[1]
    per_rank = num_experts // world
    expert = topk_idx.reshape(-1)
    dest = expert // per_rank
    tok = np.repeat(np.arange(tokens, dtype=np.int64), topk)
    order = np.lexsort((expert, dest))  # by destination, then expert
    expert, dest, tok = expert[order], dest[order], tok[order]
    # keep one copy per (token, destination): the first, i.e. at its lowest expert there
    _, first = np.unique(dest * tokens + tok, return_index=True)
    keep = np.sort(first)
    dest, tok = dest[keep], tok[keep]
    send_counts = np.bincount(dest, minlength=world).astype(np.int64)
    recv_counts = np.empty(world, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    n = int(recv_counts.sum())
    comm.Alltoallv([x[tok], send_counts * row], [recv_x[:n], recv_counts * row])
    got_tok = np.empty(n, dtype=np.int64)
    comm.Alltoallv([tok, send_counts], [got_tok, recv_counts])
    recv_src[:n, 0] = np.repeat(np.arange(world), recv_counts)
    recv_src[:n, 1] = got_tok
    num_recv[0] = n
    # <<< COMMBENCH EDIT
