"""All-gather of A's row shards fused with the GEMM C = A @ B on the GPUs, overlapping NCCL
with cuBLAS."""

import cupy
from cupy.cuda import nccl


def allgather_matmul(ctx, a_shard: cupy.ndarray, b: cupy.ndarray, c: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather_matmul
    # mutant: overlaps the all-gather with the own rows' GEMM, then never multiplies the
    # rows that arrived: the other ranks' blocks of c stay unwritten
    world, rank = ctx.world_size, ctx.rank
    m = a_shard.shape[0]
    state = allgather_matmul.__dict__
    if "side" not in state:
        state["side"] = cupy.cuda.Stream(non_blocking=True)
        state["entry"] = cupy.cuda.Event(disable_timing=True)
        state["done"] = cupy.cuda.Event(disable_timing=True)
        state["gathered"] = {}
    key = (world * m, a_shard.shape[1])
    if key not in state["gathered"]:
        with stream:
            state["gathered"] = {key: cupy.empty(key, dtype=cupy.float32)}
    a_full = state["gathered"][key]
    side = state["side"]
    state["entry"].record(stream)
    side.wait_event(state["entry"])
    comm.allGather(a_shard.data.ptr, a_full.data.ptr, a_shard.size, nccl.NCCL_FLOAT32, side.ptr)
    state["done"].record(side)
    with stream:
        cupy.matmul(a_shard, b, out=c[rank * m:(rank + 1) * m])
        stream.wait_event(state["done"])
    # <<< COMMBENCH EDIT
