"""Fused communication + computation: all-gather of row shards fused with a matmul.

allgather_matmul: rank r holds `a_shard` (count, k), rows r*count .. (r+1)*count - 1 of A, and
its own weight `b` (k, n) (different on every rank). Every rank must write
`c` (world * count, n) = A @ b, with A the row shards of all ranks stacked in rank order.

count = m, the rows of A each rank holds (k and n come from the task's params);
bytes = the gathered A (world * count * k * itemsize), bus factor (n-1)/n as for an all-gather.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial

# random_data's floats are integers over 64: scaled by 64 they are exact integers
SCALE = 64


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b without rounding error when the inputs are multiples of 1/SCALE (random_data's
    are): the products are then integers over SCALE^2, and a float64 matmul of the scaled
    integers is exact whatever its summation order while every partial sum stays below 2^53;
    past that bound the matmul is done in int64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ai, bi = np.rint(a64 * SCALE), np.rint(b64 * SCALE)
    if not (np.array_equal(ai, a64 * SCALE) and np.array_equal(bi, b64 * SCALE)):
        return a64 @ b64  # not multiples of 1/SCALE (inputs made some other way): plain float64
    bound = float(np.abs(ai).max(initial=0)) * float(np.abs(bi).max(initial=0)) * a.shape[1]
    if bound < 2.0 ** 53:
        prod = ai @ bi
    else:
        prod = (ai.astype(np.int64) @ bi.astype(np.int64)).astype(np.float64)
    return prod / float(SCALE * SCALE)


def wide_data(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Multiples of 1/SCALE up to +-32 (exact in float32 and float64): their products summed
    over k need more than float32's 24 bits, so a matmul done in lower precision is wrong."""
    out = rng.integers(-2048, 2048, size=shape, dtype=np.int16).astype(np.dtype(dtype))
    out *= np.dtype(dtype).type(1 / SCALE)
    return out


class AllgatherMatmul(Op):
    name = "allgather_matmul"

    def args(self, params):
        return ["a_shard", "b", "c"]

    @staticmethod
    def _kn(params) -> tuple[int, int]:
        return int(params.get("k", 128)), int(params.get("n", 128))

    def make_trial(self, rng, count, dtype, world, params):
        k, n = self._kn(params)
        inputs = [{"a_shard": wide_data(rng, (count, k), dtype),
                   "b": wide_data(rng, (k, n), dtype)} for _ in range(world)]
        outputs = [{"c": ((world * count, n), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        a = np.concatenate([named["a_shard"] for named in trial.inputs], axis=0)
        return [{"c": _exact_matmul(a, named["b"])} for named in trial.inputs]

    def bytes(self, count, dtype, world, params):
        k, _ = self._kn(params)
        return world * count * k * np.dtype(dtype).itemsize, (world - 1) / world


OPS = {"allgather_matmul": AllgatherMatmul()}
