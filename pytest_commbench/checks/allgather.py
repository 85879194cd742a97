"""All-gather: every rank ends with all ranks' inputs concatenated in rank order.

count = elements each rank contributes (its `sendbuf`); every rank's `recvbuf` holds
count * world elements, rank r's input at [r * count, (r + 1) * count).
bytes = count * world * itemsize; bus factor (n-1)/n (nccl-tests).
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random


class AllGather(Op):
    name = "allgather"
    exact = True  # pure data movement: bit for bit

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"sendbuf": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count * world,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        whole = np.empty(count * world, dtype=dtype)
        for rank, named in enumerate(trial.inputs):
            whole[rank * count:(rank + 1) * count] = named["sendbuf"]
        return [{"recvbuf": whole} for _ in range(world)]

    def bytes(self, count, dtype, world, params):
        return count * world * np.dtype(dtype).itemsize, (world - 1) / world


OPS = {"allgather": AllGather()}
