"""Reduce-scatter (sum) of GPU tensors through torch.distributed (NCCL): rank r ends with block
r of the element-wise sum of all ranks' sendbufs."""

import torch
import torch.distributed as dist


def reduce_scatter(ctx, sendbuf: torch.Tensor, recvbuf: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT reduce_scatter
    raise NotImplementedError("reduce-scatter sendbuf into recvbuf here")
    # <<< COMMBENCH EDIT
