"""MoE expert-parallel dispatch: send every token to each rank that hosts one of its experts."""

import numpy as np
from mpi4py import MPI


def moe_dispatch(ctx, x: np.ndarray, topk_idx: np.ndarray, num_experts: int,
                 recv_x: np.ndarray, recv_src: np.ndarray, num_recv: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT dispatch
    raise NotImplementedError("write the dispatch here")
    # <<< COMMBENCH EDIT
