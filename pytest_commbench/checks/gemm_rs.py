"""A GEMM fused with a reduce-scatter: the row-parallel linear layer of tensor parallelism.

gemm_reduce_scatter: the inner dimension of a product is split across the ranks. Rank r holds
`a` (world * count, k), its k columns of the whole left operand, and `b` (k, n), its k rows of
the whole right operand (k and n come from the task's params; every rank's `a` and `b` differ).
The whole product is the sum over the ranks of a_r @ b_r, of shape (world * count, n); rank r
must write `c` (count, n) = rows r*count .. (r+1)*count - 1 of that sum.

count = m, the output rows each rank ends with (the product has world * count rows);
bytes = the whole product (world * count * n * itemsize), bus factor (n-1)/n as for a
reduce-scatter.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, random_data

# random_data's floats are integers over 64: scaled by 64 they are exact integers
SCALE = 64


def _scaled(x: np.ndarray) -> np.ndarray | None:
    """x * SCALE as float64 integers, or None when x is not made of multiples of 1/SCALE."""
    x64 = x.astype(np.float64)
    xi = np.rint(x64 * SCALE)
    return xi if np.array_equal(xi, x64 * SCALE) else None


def exact_sum_of_products(pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """sum(a @ b for a, b in pairs) in float64, without rounding error when every input is a
    multiple of 1/SCALE (random_data's are, shifted or not): the scaled products are integers,
    and float64 sums of integers are exact whatever their order while every partial sum stays
    below 2^53; past that bound the sum is done in int64. Inputs made some other way get a
    plain float64 sum."""
    scaled = [(_scaled(a), _scaled(b)) for a, b in pairs]
    if any(ai is None or bi is None for ai, bi in scaled):
        return sum(a.astype(np.float64) @ b.astype(np.float64) for a, b in pairs)
    bound = sum(float(np.abs(ai).max(initial=0)) * float(np.abs(bi).max(initial=0)) * ai.shape[1]
                for ai, bi in scaled)
    if bound < 2.0 ** 53:
        total = np.zeros((pairs[0][0].shape[0], pairs[0][1].shape[1]), dtype=np.float64)
        for ai, bi in scaled:
            total += ai @ bi
    else:
        wide = np.zeros((pairs[0][0].shape[0], pairs[0][1].shape[1]), dtype=np.int64)
        for ai, bi in scaled:
            wide += ai.astype(np.int64) @ bi.astype(np.int64)
        total = wide.astype(np.float64)
    return total / float(SCALE * SCALE)


class GemmReduceScatter(Op):
    name = "gemm_reduce_scatter"

    def args(self, params):
        return ["a", "b", "c"]

    @staticmethod
    def _kn(params) -> tuple[int, int]:
        return int(params.get("k", 128)), int(params.get("n", 128))

    def make_trial(self, rng, count, dtype, world, params):
        k, n = self._kn(params)
        inputs = [{"a": random_data(rng, (world * count, k), dtype),
                   "b": random_data(rng, (k, n), dtype)} for _ in range(world)]
        outputs = [{"c": ((count, n), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        # block by block: rank r's rows of every rank's product, summed (never the whole
        # (world * count, n) product at once)
        want = []
        for r in range(world):
            rows = slice(r * count, (r + 1) * count)
            want.append({"c": exact_sum_of_products(
                [(named["a"][rows], named["b"]) for named in trial.inputs])})
        return want

    def bytes(self, count, dtype, world, params):
        _, n = self._kn(params)
        return world * count * n * np.dtype(dtype).itemsize, (world - 1) / world


OPS = {"gemm_reduce_scatter": GemmReduceScatter()}
