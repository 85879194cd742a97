"""MoE expert-parallel dispatch through torch.distributed (NCCL): every token goes once to each
rank that hosts one of its experts, in a fixed layout."""

import torch
import torch.distributed as dist


def moe_dispatch(ctx, x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int,
                 recv_x: torch.Tensor, recv_src: torch.Tensor, num_recv: torch.Tensor) -> None:
    group = ctx.group  # every rank, NCCL backend
    stream = ctx.torch_stream  # the stream to enqueue the work on
    # >>> COMMBENCH EDIT dispatch
    world, rank = ctx.world_size, ctx.rank
    tokens = x.shape[0]
    per_rank = num_experts // world  # expert e lives on rank e // per_rank
    with torch.cuda.stream(stream):
        # one key per (destination rank, token) pair that carries a token, d * T + t: unique()
        # sorts them and drops repeats (a token with several experts on one rank goes there
        # once), so they come out by destination, then by token index: each destination's
        # rows are one contiguous run, in the order its layout wants this source's rows
        dest = torch.div(topk_idx, per_rank, rounding_mode="floor")
        token = torch.arange(tokens, dtype=topk_idx.dtype, device=topk_idx.device).unsqueeze(1)
        keys = torch.unique(dest * tokens + token)
        dst, tok = torch.div(keys, tokens, rounding_mode="floor"), keys % tokens
        send_counts = torch.bincount(dst, minlength=world)
        # how many rows every source sends this rank: a small all-to-all of the counts; the
        # split sizes are host integers, so the counts come to the host (one synchronization)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        counts = torch.stack([send_counts, recv_counts]).cpu()
        send_splits, recv_splits = counts[0].tolist(), counts[1].tolist()
        n = sum(recv_splits)
        # the payload: the rows in key order; the all-to-all lands them by source rank
        # ascending, each source's in the order it sent them: the layout, at its final place
        rows = x.index_select(0, tok)
        dist.all_to_all_single(recv_x[:n], rows, recv_splits, send_splits, group=group)
        # and the (source rank, token index) pair of every row alongside
        pairs = torch.stack([torch.full_like(tok, rank), tok], dim=1)
        dist.all_to_all_single(recv_src[:n], pairs, recv_splits, send_splits, group=group)
        num_recv.fill_(n)
    # <<< COMMBENCH EDIT
