"""GEMMs fused with communication at tile granularity (the bare-metal CUDA fusion tasks).

gemm_allreduce: the row-parallel linear layer followed by an all-reduce. The inner dimension
of a product is split across the ranks: rank r holds `a` (count, k), its k columns of the
whole left operand, and `b` (k, n), its k rows of the whole right operand (k and n come from
the task's params; every rank's `a` and `b` differ). Every rank must write
`c` (count, n) = sum over all ranks q of a_q @ b_q.
    Inputs: float32 with every bit of the significand used (random signs, magnitudes in
    [0.5, 2): `full_random`), so no narrower type carries them.
    Expected: the float64 sum of the float64 products. Error bound per element (added to the
    manifest's atol, like `sum_slack`): each rank's partial is a float32 sum of k products (in
    any order, products rounded or fused), and the world partials are summed in float32 (in
    any order): together within (k + world) * 2^-24 * sum_q (|a_q| @ |b_q|) of the exact sum;
    the bound is doubled for slack. (Any float32 order of all world * k products has a
    worst-case bound world times as large, but errors near it would need every rounding to
    go the same way: in practice every float32 order stays inside this one.)
    count = m, the rows of the output; bytes = count * n * 4 (the reduced output), bus factor
    2(n-1)/n as for an all-reduce.

allgather_matmul_fp8: the column-parallel linear layer with a float8 activation gathered
along its rows. Rank r holds `a_shard` (count, k) uint8, the float8 e4m3 bits of rows
r*count .. (r+1)*count - 1 of A, with `a_scale` (count,) float32, one scale per row of its
shard; and its own weight `b` (k, n) uint8 (float8 e4m3 bits, different on every rank) with
`b_scale` (n,) float32, one scale per column. Every rank must write
`c` (world * count, n) float32 = (A * sa[:, None]) @ (b * sb[None, :]), A and sa the shards and
row scales of all ranks stacked in rank order, b and sb that rank's own.
    Inputs: e4m3 values of normally distributed numbers (about 0.01 to 100 in magnitude,
    subnormals and zeros included, never NaN), scales positive float32 with full significands
    (2^-5 .. 2^-3).
    Expected: sa_i * sb_j * (A @ b)_ij in float64 (the e4m3 products and their sum over k are
    exact in float64). Error bound per element (added to atol): float32 arithmetic in any order
    (the scales applied before or after the sum) is within (k + 2) * 2^-24 *
    sa_i * sb_j * (|A| @ |b|)_ij of it; doubled for slack.
    count = m, the rows of A each rank holds; bytes = the gathered A (world * count * k bytes),
    bus factor (n-1)/n as for an all-gather.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random
from .lowp import decode, encode

F32_UNIT = 2.0 ** -24  # float32 unit roundoff


class GemmAllreduce(Op):
    name = "gemm_allreduce"

    def args(self, params):
        return ["a", "b", "c"]

    @staticmethod
    def _kn(params) -> tuple[int, int]:
        return int(params.get("k", 128)), int(params.get("n", 128))

    def make_trial(self, rng, count, dtype, world, params):
        k, n = self._kn(params)
        inputs = [{"a": full_random(rng, (count, k), "float32"),
                   "b": full_random(rng, (k, n), "float32")} for _ in range(world)]
        outputs = [{"c": ((count, n), "float32")} for _ in range(world)]
        return Trial(inputs, outputs)

    @staticmethod
    def _stacked(trial) -> tuple[np.ndarray, np.ndarray]:
        """The whole operands: every rank's columns of A side by side, its rows of B stacked."""
        a = np.concatenate([named["a"] for named in trial.inputs], axis=1).astype(np.float64)
        b = np.concatenate([named["b"] for named in trial.inputs], axis=0).astype(np.float64)
        return a, b

    def expected(self, trial, count, dtype, world, params):
        a, b = self._stacked(trial)
        c = a @ b
        return [{"c": c} for _ in trial.inputs]

    def slack(self, trial, case):
        a, b = self._stacked(trial)
        world = len(trial.inputs)
        k = a.shape[1] // world  # every rank's slice of the inner dimension
        bound = np.abs(a) @ np.abs(b)
        bound *= 2.0 * (k + world) * F32_UNIT
        return [{"c": bound} for _ in trial.inputs]

    def bytes(self, count, dtype, world, params):
        _, n = self._kn(params)
        return count * n * 4, 2 * (world - 1) / world


def fp8_values(rng: np.random.Generator, shape) -> np.ndarray:
    """float8 e4m3 bits (uint8) of normally distributed values (standard deviation 16):
    magnitudes from subnormals to about 100, zeros possible, never NaN (encode saturates)."""
    return encode(rng.standard_normal(size=shape) * 16.0, "float8_e4m3")


def fp8_scales(rng: np.random.Generator, size: int) -> np.ndarray:
    """Positive float32 scales in [2^-5, 2^-3) with random full significands."""
    return (2.0 ** rng.uniform(-5.0, -3.0, size=size)).astype(np.float32)


class AllgatherMatmulFp8(Op):
    name = "allgather_matmul_fp8"

    def args(self, params):
        return ["a_shard", "a_scale", "b", "b_scale", "c"]

    @staticmethod
    def _kn(params) -> tuple[int, int]:
        return int(params.get("k", 128)), int(params.get("n", 128))

    def make_trial(self, rng, count, dtype, world, params):
        k, n = self._kn(params)
        inputs = [{"a_shard": fp8_values(rng, (count, k)),
                   "a_scale": fp8_scales(rng, count),
                   "b": fp8_values(rng, (k, n)),
                   "b_scale": fp8_scales(rng, n)} for _ in range(world)]
        outputs = [{"c": ((world * count, n), "float32")} for _ in range(world)]
        return Trial(inputs, outputs)

    @staticmethod
    def _gathered(trial) -> tuple[np.ndarray, np.ndarray]:
        """The whole A (decoded, float64) and its row scales (float64), in rank order."""
        a = np.concatenate([decode(named["a_shard"], "float8_e4m3") for named in trial.inputs],
                           axis=0)
        sa = np.concatenate([named["a_scale"] for named in trial.inputs]).astype(np.float64)
        return a, sa

    def expected(self, trial, count, dtype, world, params):
        a, sa = self._gathered(trial)
        want = []
        for named in trial.inputs:
            b = decode(named["b"], "float8_e4m3")
            sb = named["b_scale"].astype(np.float64)
            c = a @ b  # exact: e4m3 products are multiples of 2^-18 below 2^18
            c *= sa[:, None]
            c *= sb[None, :]
            want.append({"c": c})
        return want

    def slack(self, trial, case):
        k, _ = self._kn(case.params)
        a, sa = self._gathered(trial)
        mag = np.abs(a)
        out = []
        for named in trial.inputs:
            b = np.abs(decode(named["b"], "float8_e4m3"))
            bound = mag @ b
            bound *= sa[:, None]
            bound *= named["b_scale"].astype(np.float64)[None, :]
            bound *= 2.0 * (k + 2) * F32_UNIT
            out.append({"c": bound})
        return out

    def bytes(self, count, dtype, world, params):
        k, _ = self._kn(params)
        return world * count * k, (world - 1) / world


OPS = {"gemm_allreduce": GemmAllreduce(), "allgather_matmul_fp8": AllgatherMatmulFp8()}
