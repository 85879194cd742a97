"""All-gather of GPU tensors through torch.distributed (NCCL): every rank ends with every
rank's sendbuf, in rank order."""

import torch
import torch.distributed as dist


def allgather(ctx, sendbuf: torch.Tensor, recvbuf: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT allgather
    # one flat all-gather straight from sendbuf into recvbuf (rank-major blocks of
    # sendbuf.numel() elements), enqueued after the harness's stream
    with torch.cuda.stream(stream):
        dist.all_gather_into_tensor(recvbuf, sendbuf, group=group)
    # <<< COMMBENCH EDIT
