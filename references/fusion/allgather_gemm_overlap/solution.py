"""All-gather of A's row shards fused with the GEMM C = A @ B on the GPUs, overlapping NCCL
with cuBLAS."""

import cupy
from cupy.cuda import nccl


def allgather_matmul(ctx, a_shard: cupy.ndarray, b: cupy.ndarray, c: cupy.ndarray) -> None:
    comm: nccl.NcclCommunicator = ctx.nccl
    stream: cupy.cuda.Stream = ctx.stream
    # >>> COMMBENCH EDIT allgather_matmul
    world, rank = ctx.world_size, ctx.rank
    m = a_shard.shape[0]
    dtype = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64}[a_shard.dtype.name]
    state = allgather_matmul.__dict__  # streams, events and the gather buffer, across calls
    if "side" not in state:
        state["side"] = cupy.cuda.Stream(non_blocking=True)
        state["entry"] = cupy.cuda.Event(disable_timing=True)
        state["arrived"] = [cupy.cuda.Event(disable_timing=True) for _ in range(world)]
        state["gathered"] = {}
    key = (world * m, a_shard.shape[1], a_shard.dtype.name)
    if key not in state["gathered"]:
        with stream:  # one shape at a time: drop the previous size's buffer
            state["gathered"] = {key: cupy.empty(key[:2], dtype=a_shard.dtype)}
    a_full = state["gathered"][key]

    if world == 1 or a_shard.nbytes < (1 << 20):
        # latency-bound (shards under 1 MiB): one all-gather, then one GEMM, in stream order
        comm.allGather(a_shard.data.ptr, a_full.data.ptr, a_shard.size, dtype, stream.ptr)
        with stream:
            cupy.matmul(a_full, b, out=c)
        return

    # the gather runs on a side stream, once what the caller queued before is done (a_full
    # is free again); step s exchanges whole shards with the ranks s away (rank + s gets ours,
    # rank - s sends its own), so no step waits for an earlier one's data
    side, arrived = state["side"], state["arrived"]
    state["entry"].record(stream)
    side.wait_event(state["entry"])
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        nccl.groupStart()
        comm.send(a_shard.data.ptr, a_shard.size, dtype, dst, side.ptr)
        comm.recv(a_full[src * m:(src + 1) * m].data.ptr, a_shard.size, dtype, src, side.ptr)
        nccl.groupEnd()
        arrived[s].record(side)
    # meanwhile the own rows, then every shard as soon as its step's event says it landed
    with stream:
        cupy.matmul(a_shard, b, out=c[rank * m:(rank + 1) * m])
        for s in range(1, world):
            src = (rank - s) % world
            stream.wait_event(arrived[s])
            cupy.matmul(a_full[src * m:(src + 1) * m], b, out=c[src * m:(src + 1) * m])
    # <<< COMMBENCH EDIT
