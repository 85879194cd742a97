"""All-reduce (sum): every rank ends with the element-wise sum of all ranks' inputs.

count = elements per buffer; bytes = count * itemsize; bus factor 2(n-1)/n (nccl-tests).
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random, sum_slack


class AllReduce(Op):
    name = "allreduce"

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"sendbuf": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        total = np.zeros(count, dtype=np.float64 if np.dtype(dtype).kind == "f" else np.int64)
        for named in trial.inputs:
            total += named["sendbuf"]
        return [{"recvbuf": total} for _ in range(world)]

    def slack(self, trial, case):
        bound = sum_slack([named["sendbuf"] for named in trial.inputs], case.dtype)
        return [{"recvbuf": bound} for _ in range(case.world)]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 2.0 * (world - 1) / world


OPS = {"allreduce": AllReduce()}
