"""All-gather of GPU tensors through torch.distributed (NCCL): every rank ends with every
rank's sendbuf, in rank order."""

import torch
import torch.distributed as dist


def allgather(ctx, sendbuf: torch.Tensor, recvbuf: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT allgather
    raise NotImplementedError("gather every rank's sendbuf into recvbuf here")
    # <<< COMMBENCH EDIT
