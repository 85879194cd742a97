"""All-reduce of bfloat16 data: summed wider, rounded to bfloat16 once.

allreduce_bf16(sendbuf, recvbuf)
    count = elements per buffer. Both buffers hold the raw bits of `count` bfloat16 values
    (uint16, see lowp.py). On every rank recvbuf[i] must be the sum over ranks of sendbuf[i],
    rounded to bfloat16 once: within

        0.5 * ulp_bf16(|exact| + s) + s,    s = 2 (n - 1) * 2^-24 * sum over ranks of |x|

    of the exact sum (`exact`, in float64), plus the manifest's atol + rtol * |exact|. Half an
    ulp is what one rounding to nearest costs (at a tie either neighbour passes); s bounds
    what a float32 accumulation in any order may add before it (2^-24 is float32's unit
    roundoff, doubled for slack). A tolerance of a whole ulp would accept a sum cut to
    bfloat16 by dropping its low bits, which is up to an ulp off.

Inputs: random sign, magnitude 2^-6 .. 2^4 (the exponent drawn uniformly over those ten
binades) and a random 7-bit significand, so the bfloat16 sum has bits below its last place
on most elements and rounding matters. Every input is a multiple of 2^-13 below 2^4, so any
sum of up to 16 of them needs at most 21 significant bits: a float32 accumulation is exact in
any order (s is a bound an exact sum never needs), while one carried in bfloat16 rounds after
every addition and, from 3 ranks on, misses the once-rounded answer on many elements (with 2
ranks there is only one addition: it is the once-rounded answer).

bytes = count * 2; bus factor 2(n-1)/n (nccl-tests' all-reduce).
"""

from __future__ import annotations

import numpy as np

from .base import Op, Trial
from .lowp import decode, encode, storage, ulp

KIND = "bfloat16"
EXP_LO, EXP_HI = -6, 3  # the inputs' binades: magnitudes in [2^EXP_LO, 2^(EXP_HI + 1))
F32_UNIT = 2.0 ** -24  # float32's unit roundoff


def bf16_inputs(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` bfloat16 values as their bits: random sign, binade and 7-bit significand."""
    sign = rng.integers(0, 2, size=count, dtype=np.uint16) << np.uint16(15)
    exponent = rng.integers(127 + EXP_LO, 127 + EXP_HI + 1, size=count, dtype=np.uint16)
    significand = rng.integers(0, 128, size=count, dtype=np.uint16)
    return sign | (exponent << np.uint16(7)) | significand


def exact_sum(inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the exact float64 sum of the ranks' bfloat16 bits, the sum of their magnitudes)."""
    total = np.zeros(inputs[0].shape, dtype=np.float64)
    mag = np.zeros(inputs[0].shape, dtype=np.float64)
    for bits in inputs:
        x = decode(bits, KIND)
        total += x
        mag += np.abs(x)
    return total, mag


def tolerance(exact: np.ndarray, mag: np.ndarray, world: int) -> np.ndarray:
    """Half a bfloat16 ulp of the exact sum (at the float32 sum's largest possible magnitude)
    plus the float32 summation bound."""
    s = 2.0 * max(world - 1, 1) * F32_UNIT * mag
    return 0.5 * ulp(np.abs(exact) + s, KIND) + s


class AllReduceBf16(Op):
    name = "allreduce_bf16"

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def make_trial(self, rng, count, dtype, world, params):
        if dtype != KIND:
            raise ValueError(f"{self.name} sums bfloat16 data, not {dtype}")
        inputs = [{"sendbuf": bf16_inputs(rng, count)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), storage(KIND))} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        """The exact sum rounded to bfloat16 once, as bits (every rank the same)."""
        total, _ = exact_sum([named["sendbuf"] for named in trial.inputs])
        bits = encode(total, KIND)
        return [{"recvbuf": bits} for _ in range(world)]

    def verify(self, trial, got, events, case, rtol, atol, want=None, slack=None):
        exact, mag = exact_sum([named["sendbuf"] for named in trial.inputs])
        bound = tolerance(exact, mag, case.world)
        bound += atol + rtol * np.abs(exact)
        errors = []
        for rank, outputs in enumerate(got):
            bits = outputs.get("recvbuf")
            if bits is None:
                errors.append(f"rank {rank}: output 'recvbuf' missing")
                continue
            bits = np.asarray(bits).reshape(-1)
            if bits.shape != exact.shape:
                errors.append(f"rank {rank}: output 'recvbuf': shape {bits.shape}, expected "
                              f"{exact.shape}")
                continue
            values = decode(bits, KIND)
            ok = np.abs(values - exact) <= bound  # NaN (the poison's bits) is never ok
            if ok.all():
                continue
            bad = np.flatnonzero(~ok)
            i = int(bad[0])
            note = (" (poison: the element was never written)"
                    if bits[i] == np.iinfo(np.uint16).max else "")
            errors.append(
                f"rank {rank}: output 'recvbuf': {bad.size} of {bits.size} elements wrong; first "
                f"at index {i}: got {values[i]!r} (bits 0x{int(bits[i]):04x}), expected "
                f"{exact[i]!r} within {bound[i]:.3g} (the exact sum rounded to bfloat16 once: "
                f"{float(decode(encode(exact[i:i + 1], KIND), KIND)[0])!r}){note}")
        return errors

    def bytes(self, count, dtype, world, params):
        return count * 2, 2.0 * (world - 1) / world


OPS = {"allreduce_bf16": AllReduceBf16()}
