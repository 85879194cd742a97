"""MoE expert-parallel dispatch through torch.distributed (NCCL): every token goes once to each
rank that hosts one of its experts, in a fixed layout."""

import torch
import torch.distributed as dist


def moe_dispatch(ctx, x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int,
                 recv_x: torch.Tensor, recv_src: torch.Tensor, num_recv: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT dispatch
    raise NotImplementedError("dispatch this rank's tokens to their experts' ranks here")
    # <<< COMMBENCH EDIT
