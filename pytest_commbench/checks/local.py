"""Rank-local operations: no communication, every rank transforms its own input.

scale_shift: out = 2 * x + 1, element by element.

count = elements of each rank's `x` and `out` (1-D); bytes = count * itemsize (the input, as
nccl-tests counts a buffer); bus factor 1. The inputs (random_data: multiples of 1/64 below 8 in
magnitude) make 2 * x + 1 exact in float32
and float64, so the comparison is bit for bit (use those dtypes). Every rank gets different
data, so a rank that writes another rank's result, or a stale one, is caught.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, random_data


class ScaleShift(Op):
    name = "scale_shift"
    exact = True  # 2 * x + 1 is exact for these inputs

    def args(self, params):
        return ["x", "out"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"x": random_data(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        return [{"out": 2.0 * named["x"].astype(np.float64) + 1.0} for named in trial.inputs]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


OPS = {"scale_shift": ScaleShift()}
