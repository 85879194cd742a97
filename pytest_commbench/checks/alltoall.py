"""All-to-all: block j of rank i's input ends up as block i of rank j's output.

count = elements per block; each rank's `sendbuf` and `recvbuf` are 1-D arrays of
world * count elements, block j being elements [j * count, (j + 1) * count). bytes =
count * world * itemsize (one rank's whole buffer, as nccl-tests counts it); bus factor
(n-1)/n. Every element of every input is different from its neighbours' (random data), so
a block that lands in the wrong slot, or a slot that is never written, is caught.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random


class AllToAll(Op):
    name = "alltoall"
    exact = True

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"sendbuf": full_random(rng, (world * count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((world * count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        blocks = [named["sendbuf"].reshape(world, count) for named in trial.inputs]
        return [
            {"recvbuf": np.concatenate([blocks[src][dst] for src in range(world)])}
            for dst in range(world)
        ]

    def bytes(self, count, dtype, world, params):
        return count * world * np.dtype(dtype).itemsize, (world - 1) / world


OPS = {"alltoall": AllToAll()}
