"""Producer/consumer protocols (FIFOs between a GPU and its host, iterated neighbour signals):
exact oracles of what the protocol must deliver.

permute_scale_shift(ctx, x, idx, out)
    inputs   x (count,) float: multiples of 1/64 below 8 in magnitude (random_data), so
             2 * x + 1 is exact in float32; idx (count,) int32: a random permutation of
             0 .. count-1, different on every rank and every call
    output   out (count,) float: out[idx[i]] = 2 * x[i] + 1 for every i, bit for bit.
    Every rank transforms its own data (no communication); the permutation makes the place
    of a value depend on data the producer carries with it, so a consumer that writes values
    in the order it receives them (instead of where their index says) is wrong.

ring_recurrence(ctx, x, out, iters)
    inputs   x (count,) int32 (any bits), one vector per rank; the parameter `iters` >= 1
    output   out (count,) int32 on every rank: the state after `iters` steps of the ring
             recurrence below, computed with unsigned 32-bit arithmetic (mod 2^32), bit for bit.
    With n ranks, s_r(0) = x_r and, for k = 1 .. iters, element by element:
        s_r(k) = 2 * s_r(k-1) + s_{(r-1) mod n}(k-1)      (mod 2^32)
    i.e. in step k every rank sends its state of step k-1 to its right neighbour (r + 1) and
    adds twice its own state to what its left neighbour (r - 1) sent. The step is a
    bijection of the ranks' states (its matrix 2I + P has the odd determinant 2^n - (-1)^n),
    so a message taken from the wrong step or the wrong neighbour changes the final states;
    an odd factor (3I + P, whose determinant is even for even n) would let 64 steps wipe out
    most of the bits.

count = elements per rank; bytes = count * itemsize (one rank's vector), bus factor 1.
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial, random_data

MULTIPLIER = 2  # the recurrence's factor on a rank's own state (see the docstring)


class PermuteScaleShift(Op):
    name = "permute_scale_shift"
    exact = True  # 2 * x + 1 is exact for these inputs, and the rest is placement

    def args(self, params):
        return ["x", "idx", "out"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"x": random_data(rng, (count,), dtype),
                   "idx": rng.permutation(count).astype(np.int32)} for _ in range(world)]
        outputs = [{"out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        want = []
        for named in trial.inputs:
            out = np.empty(count, dtype=np.float64)
            out[named["idx"].astype(np.int64)] = 2.0 * named["x"].astype(np.float64) + 1.0
            want.append({"out": out})
        return want


def ring_states(xs: list[np.ndarray], iters: int) -> list[np.ndarray]:
    """The ring recurrence of `ring_recurrence`, simulated in uint32 (wrapping) arithmetic:
    every rank's state after `iters` steps, as int32 (the same bits)."""
    s = np.stack([np.asarray(x).view(np.uint32) for x in xs]).astype(np.uint32)
    factor = np.uint32(MULTIPLIER)
    for _ in range(iters):
        left = np.roll(s, 1, axis=0)  # row r: the state of rank r - 1
        s = s * factor + left  # uint32 arithmetic wraps (mod 2^32)
    return [row.view(np.int32).copy() for row in s]


class RingRecurrence(Op):
    name = "ring_recurrence"
    exact = True

    def args(self, params):
        return ["x", "out", "iters"]

    @staticmethod
    def _iters(params) -> int:
        iters = int(params.get("iters", 16))
        if iters < 1:
            raise ValueError(f"iters={iters} must be at least 1")
        return iters

    def make_trial(self, rng, count, dtype, world, params):
        if np.dtype(dtype) != np.dtype(np.int32):
            raise ValueError(f"{self.name} is defined on int32 data, not {dtype}")
        self._iters(params)
        inputs = [{"x": rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max,
                                     size=count, dtype=np.int32, endpoint=True)}
                  for _ in range(world)]
        outputs = [{"out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        states = ring_states([named["x"] for named in trial.inputs], self._iters(params))
        return [{"out": s} for s in states]


OPS = {"permute_scale_shift": PermuteScaleShift(), "ring_recurrence": RingRecurrence()}
