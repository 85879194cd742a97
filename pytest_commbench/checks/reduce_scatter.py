"""Reduce-scatter (sum): rank r ends with block r of the element-wise sum of all ranks' inputs.

count = elements each rank receives (its `recvbuf`); every rank's `sendbuf` holds
count * world elements, block r at [r * count, (r + 1) * count).
bytes = count * world * itemsize; bus factor (n-1)/n (nccl-tests).
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random, sum_slack


class ReduceScatter(Op):
    name = "reduce_scatter"

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"sendbuf": full_random(rng, (count * world,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        acc = np.float64 if np.dtype(dtype).kind == "f" else np.int64
        total = np.zeros(count * world, dtype=acc)
        for named in trial.inputs:
            total += named["sendbuf"]
        return [{"recvbuf": total[r * count:(r + 1) * count]} for r in range(world)]

    def slack(self, trial, case):
        bound = sum_slack([named["sendbuf"] for named in trial.inputs], case.dtype)
        c = case.count
        return [{"recvbuf": bound[r * c:(r + 1) * c]} for r in range(case.world)]

    def bytes(self, count, dtype, world, params):
        return count * world * np.dtype(dtype).itemsize, (world - 1) / world


OPS = {"reduce_scatter": ReduceScatter()}
