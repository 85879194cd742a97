"""MoE expert-parallel combine: return the experts' rows to their tokens and sum them."""

import numpy as np
from mpi4py import MPI


def moe_combine(ctx, y: np.ndarray, recv_src: np.ndarray, topk_idx: np.ndarray,
                num_experts: int, hidden: int, topk: int, out: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT combine
    raise NotImplementedError("write the combine here")
    # <<< COMMBENCH EDIT
