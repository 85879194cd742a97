"""MoE expert-parallel combine: return the experts' rows to their tokens and sum them."""

import numpy as np
from mpi4py import MPI


def moe_combine(ctx, y: np.ndarray, recv_src: np.ndarray, topk_idx: np.ndarray,
                num_experts: int, hidden: int, topk: int, out: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT combine
    # mutant: assumes each rank returns this rank's tokens grouped by expert (the expert-major
    # order of an expert kernel), so rows land on the wrong tokens
    world = comm.Get_size()
    tokens, row = out.shape
    per_rank = num_experts // world
    dest = topk_idx // per_rank
    hit = np.zeros((world, tokens), dtype=bool)
    hit[dest, np.arange(tokens)[:, None]] = True
    back_counts = hit.sum(axis=1)
    send_counts = np.bincount(recv_src[:, 0], minlength=world)
    back = np.empty((int(back_counts.sum()), row), dtype=out.dtype)
    comm.Alltoallv([y, send_counts * row], [back, back_counts * row])
    # the expert on rank d a token was sent for: its lowest one there
    big = np.iinfo(np.int64).max
    out.fill(0)
    lo = 0
    for d in range(world):
        mine = np.flatnonzero(hit[d])
        key = np.where(dest[mine] == d, topk_idx[mine], big).min(axis=1)
        mine = mine[np.argsort(key, kind="stable")]
        out[mine] += back[lo:lo + mine.size]
        lo += mine.size
    # <<< COMMBENCH EDIT
