"""A row-parallel linear layer on GPUs: each rank's partial GEMM, reduce-scattered by rows,
overlapping cuBLAS with NCCL."""

import cupy
from cupy.cuda import nccl


def gemm_reduce_scatter(ctx, a: cupy.ndarray, b: cupy.ndarray, c: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT gemm_reduce_scatter
    # mutant: multiplies only this rank's own block of rows and never sums the other ranks'
    # partial products into it
    rank, m = ctx.rank, c.shape[0]
    with stream:
        cupy.matmul(a[rank * m:(rank + 1) * m], b, out=c)
    # <<< COMMBENCH EDIT
