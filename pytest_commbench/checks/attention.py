"""Sequence-parallel attention (ring, Ulysses) and the fused all-reduce + residual + RMSNorm.

ring_attention(ctx, q, k, v, head_dim, o)
    count = S_local, the query/key rows each rank holds; `head_dim` (D) from the params.
    inputs   q, k, v (S_local, D) float32: rank r's rows r*S_local .. (r+1)*S_local - 1 of
             the whole sequence (S = world * S_local rows)
    output   o (S_local, D) float32: o = softmax(q @ K^T / sqrt(D)) @ V, K and V the keys and
             values of ALL ranks (non-causal: every query sees every key; one head)

ulysses_attention(ctx, q, k, v, heads, head_dim, o)
    count = S_local; `heads` (H, divisible by the world size) and `head_dim` (D) from the
    params.
    inputs   q, k, v (S_local, H, D) float32, sequence-sharded as above
    output   o (S_local, H, D) float32: o[:, j] = softmax(q[:, j] @ K_j^T / sqrt(D)) @ V_j for
             every head j, K_j / V_j head j's keys / values of all S rows

allreduce_rmsnorm(ctx, x, residual, gamma, hidden, y, residual_out)
    count = T tokens; `hidden` (H) from the params; EPS = 1e-6.
    inputs   x (T, H) float32: this rank's partial sums (different on every rank);
             residual (T, H) float32 and gamma (H,) float32: the same on every rank
    outputs  residual_out (T, H) = sum over the ranks of x + residual;
             y (T, H) = residual_out / sqrt(mean(residual_out^2 over H) + EPS) * gamma

Every float input uses the whole float32 significand (`full_random`: random signs,
magnitudes 0.5 to 2). In allreduce_rmsnorm some rows (a random quarter, at least one once
T >= 2) are scaled by 2^-11 on every rank, so their mean square is of the order of EPS and
where EPS enters the formula matters.

Tolerances: the attention outputs are compared with float64 results under the manifest's
rtol/atol (float32 arithmetic in any order stays two orders of magnitude inside them, TF32 or
bfloat16 products do not); allreduce_rmsnorm adds to atol a per-element bound of what float32
arithmetic in any order may make (`slack`).
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, full_random, sum_slack

EPS = 1e-6  # allreduce_rmsnorm's epsilon, inside the square root
TINY = 2.0 ** -11  # the scale of allreduce_rmsnorm's small rows
ROWS = 256  # query rows per float64 block of the attention oracles (bounds their memory)


def _param(params, name: str, default=None) -> int:
    if name not in params:
        if default is None:
            raise ValueError(f"the task's check.params must give {name!r}")
        return int(default)
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"check.params.{name} must be a positive integer, got {value!r}")
    return value


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q @ k^T / sqrt(D)) @ v in float64 over the last two axes (any leading batch
    axes), a block of ROWS query rows at a time."""
    d = q.shape[-1]
    k64 = np.swapaxes(k.astype(np.float64), -1, -2)
    v64 = v.astype(np.float64)
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=np.float64)
    scale = 1.0 / np.sqrt(d)
    for lo in range(0, q.shape[-2], ROWS):
        s = np.matmul(q[..., lo:lo + ROWS, :].astype(np.float64), k64)
        s *= scale
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        total = s.sum(axis=-1, keepdims=True)
        out[..., lo:lo + ROWS, :] = np.matmul(s, v64) / total
    return out


class RingAttention(Op):
    name = "ring_attention"

    def args(self, params):
        return ["q", "k", "v", "head_dim", "o"]

    def make_trial(self, rng, count, dtype, world, params):
        d = _param(params, "head_dim")
        inputs = [{name: full_random(rng, (count, d), dtype) for name in ("q", "k", "v")}
                  for _ in range(world)]
        outputs = [{"o": ((count, d), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        k = np.concatenate([named["k"] for named in trial.inputs], axis=0)
        v = np.concatenate([named["v"] for named in trial.inputs], axis=0)
        return [{"o": attend(named["q"], k, v)} for named in trial.inputs]

    def bytes(self, count, dtype, world, params):
        # the keys and values a rank reads from its peers
        d = _param(params, "head_dim")
        return 2 * (world - 1) * count * d * np.dtype(dtype).itemsize, 1.0


class UlyssesAttention(Op):
    name = "ulysses_attention"

    def args(self, params):
        return ["q", "k", "v", "heads", "head_dim", "o"]

    @staticmethod
    def _hd(params, world) -> tuple[int, int]:
        h, d = _param(params, "heads"), _param(params, "head_dim")
        if h % world:
            raise ValueError(f"heads={h} is not divisible by the world size {world}")
        return h, d

    def make_trial(self, rng, count, dtype, world, params):
        h, d = self._hd(params, world)
        inputs = [{name: full_random(rng, (count, h, d), dtype) for name in ("q", "k", "v")}
                  for _ in range(world)]
        outputs = [{"o": ((count, h, d), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        # heads first: (H, S, D) keys and values of the whole sequence
        k = np.concatenate([named["k"] for named in trial.inputs], axis=0).transpose(1, 0, 2)
        v = np.concatenate([named["v"] for named in trial.inputs], axis=0).transpose(1, 0, 2)
        want = []
        for named in trial.inputs:
            o = attend(named["q"].transpose(1, 0, 2), k, v)  # (H, S_local, D)
            want.append({"o": np.ascontiguousarray(o.transpose(1, 0, 2))})
        return want

    def bytes(self, count, dtype, world, params):
        # the two all-to-alls: q, k, v out and o back, (n-1)/n of each leaves the rank
        h, d = self._hd(params, world)
        return 4 * count * h * d * np.dtype(dtype).itemsize, (world - 1) / world


def tiny_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    """Which of `count` rows are small: each with probability 1/4, and at least one where
    there are two rows or more (a single row is small half the time)."""
    if count == 1:
        return rng.random(1) < 0.5
    tiny = rng.random(count) < 0.25
    tiny[rng.integers(0, count)] = True
    return tiny


class AllreduceRMSNorm(Op):
    name = "allreduce_rmsnorm"

    def args(self, params):
        return ["x", "residual", "gamma", "hidden", "y", "residual_out"]

    def make_trial(self, rng, count, dtype, world, params):
        h = _param(params, "hidden")
        scale = np.where(tiny_rows(rng, count), TINY, 1.0).astype(dtype)[:, None]
        xs = []
        for _ in range(world):
            xs.append(full_random(rng, (count, h), dtype) * scale)  # a power of two: exact
        residual = full_random(rng, (count, h), dtype) * scale
        gamma = full_random(rng, (h,), dtype)
        inputs = [{"x": x, "residual": residual, "gamma": gamma} for x in xs]
        outputs = [{"y": ((count, h), dtype), "residual_out": ((count, h), dtype)}
                   for _ in range(world)]
        return Trial(inputs, outputs)

    @staticmethod
    def _sum(trial) -> np.ndarray:
        total = trial.inputs[0]["residual"].astype(np.float64)
        for named in trial.inputs:
            total += named["x"]
        return total

    def expected(self, trial, count, dtype, world, params):
        s = self._sum(trial)
        gamma = trial.inputs[0]["gamma"].astype(np.float64)
        rstd = 1.0 / np.sqrt(np.mean(s * s, axis=1, keepdims=True) + EPS)
        y = s * rstd * gamma
        return [{"y": y, "residual_out": s} for _ in range(world)]

    def slack(self, trial, case):
        """What float32 arithmetic in any order may make, doubled: the sum of the world + 1
        terms (sum_slack); the mean square taken from that sum (its error carried through,
        plus H roundings of the accumulation); the reciprocal square root (a few ulp) and
        the two products of y."""
        eps32 = float(np.finfo(np.float32).eps)  # 2^-23, twice the unit roundoff
        terms = [named["x"] for named in trial.inputs] + [trial.inputs[0]["residual"]]
        err_s = sum_slack(terms, "float32").astype(np.float64)  # |computed s - s|
        s = self._sum(trial)
        h = s.shape[1]
        abs_s = np.abs(s)
        ms = np.mean(s * s, axis=1, keepdims=True)
        # the sum's own errors carried into the squares, then H roundings of the squares
        # and their accumulation in any order and the division (h + 1 unit roundoffs)
        d_ms = (np.sum(2.0 * abs_s * err_s + err_s * err_s, axis=1, keepdims=True) / h
                + (h + 1) * 0.5 * eps32 * ms)
        denom = ms + EPS
        rstd = 1.0 / np.sqrt(denom)
        rel = 0.5 * (d_ms + eps32 * denom) / denom + 2.0 * eps32
        g = np.abs(trial.inputs[0]["gamma"].astype(np.float64))
        y_err = g * rstd * (err_s + abs_s * rel) + 2.0 * eps32 * abs_s * rstd * g
        y_err *= 2.0
        return [{"y": y_err, "residual_out": err_s} for _ in range(case.world)]

    def bytes(self, count, dtype, world, params):
        h = _param(params, "hidden")
        return count * h * np.dtype(dtype).itemsize, 2.0 * (world - 1) / world


OPS = {
    "ring_attention": RingAttention(),
    "ulysses_attention": UlyssesAttention(),
    "allreduce_rmsnorm": AllreduceRMSNorm(),
}
