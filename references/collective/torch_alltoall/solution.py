"""All-to-all of GPU tensors through torch.distributed (NCCL): block j of every rank's sendbuf
goes to rank j."""

import torch
import torch.distributed as dist


def alltoall(ctx, sendbuf: torch.Tensor, recvbuf: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT alltoall
    # both buffers are flat and rank-major: block j of sendbuf (count elements) is rank j's,
    # and block i of recvbuf comes from rank i, exactly the equal split all_to_all_single
    # makes when it is given no split sizes (n divides both lengths)
    count = sendbuf.numel() // ctx.world_size
    with torch.cuda.stream(stream):
        dist.all_to_all_single(recvbuf, sendbuf, group=group)
    # <<< COMMBENCH EDIT
