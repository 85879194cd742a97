"""MoE expert-parallel combine: return the experts' rows to their tokens and sum them."""

import numpy as np
from mpi4py import MPI


def moe_combine(ctx, y: np.ndarray, recv_src: np.ndarray, topk_idx: np.ndarray,
                num_experts: int, hidden: int, topk: int, out: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT combine
    # mutant: combines once per top-k slot, so a token with two experts on the same rank gets
    # that rank's row twice
    world = comm.Get_size()
    tokens, row = out.shape
    per_rank = num_experts // world
    dest = topk_idx // per_rank  # (T, topk)
    hit = np.zeros((world, tokens), dtype=bool)
    hit[dest, np.arange(tokens)[:, None]] = True
    back_counts = hit.sum(axis=1)
    send_counts = np.bincount(recv_src[:, 0], minlength=world)
    back = np.empty((int(back_counts.sum()), row), dtype=out.dtype)
    comm.Alltoallv([y, send_counts * row], [back, back_counts * row])
    # position of (d, t) in back: d's offset plus t's rank among the tokens sent to d
    offsets = np.concatenate(([0], np.cumsum(back_counts)[:-1]))
    pos = np.cumsum(hit, axis=1) - 1 + offsets[:, None]
    out.fill(0)
    t = np.arange(tokens)
    for k in range(topk_idx.shape[1]):
        out += back[pos[dest[:, k], t]]
    # <<< COMMBENCH EDIT
