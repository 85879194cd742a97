"""Reduce-scatter (sum) of GPU tensors through torch.distributed (NCCL): rank r ends with block
r of the element-wise sum of all ranks' sendbufs."""

import torch
import torch.distributed as dist


def reduce_scatter(ctx, sendbuf: torch.Tensor, recvbuf: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT reduce_scatter
    # sendbuf is rank-major (block r, recvbuf.numel() elements, is rank r's share of the sum),
    # the flat layout reduce_scatter_tensor takes: one call, straight into recvbuf
    inp = sendbuf
    with torch.cuda.stream(stream):
        dist.reduce_scatter_tensor(recvbuf, inp, op=dist.ReduceOp.SUM, group=group)
    # <<< COMMBENCH EDIT
