"""MoE expert-parallel combine: return the experts' rows to their tokens and sum them."""

import numpy as np
from mpi4py import MPI


def moe_combine(ctx, y: np.ndarray, recv_src: np.ndarray, topk_idx: np.ndarray,
                num_experts: int, hidden: int, topk: int, out: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT combine
    world = comm.Get_size()
    tokens, row = out.shape
    per_rank = num_experts // world
    # hit[d, t]: token t was dispatched to rank d; rank d returns its rows for this rank's
    # tokens in token order, so the routing alone says where every returned row belongs
    hit = np.zeros((world, tokens), dtype=bool)
    hit[topk_idx // per_rank, np.arange(tokens)[:, None]] = True
    back_counts = hit.sum(axis=1)
    # y is grouped by source rank already: send each group home as it is
    send_counts = np.bincount(recv_src[:, 0], minlength=world)
    back = np.empty((int(back_counts.sum()), row), dtype=out.dtype)
    comm.Alltoallv([y, send_counts * row], [back, back_counts * row])
    out.fill(0)
    lo = 0
    for d in range(world):
        mine = np.flatnonzero(hit[d])  # distinct tokens: fancy += is safe
        out[mine] += back[lo:lo + mine.size]
        lo += mine.size
    # <<< COMMBENCH EDIT
