"""Broadcast: every rank, the root included, ends with the root's input in its output.

count = elements per buffer; bytes = count * itemsize; bus factor 1 (nccl-tests).

The root is chosen per trial and handed to the solution as `ctx.root` (a Trial `extra`): each
case has one trial per rank (at least `trials`), the roots a random permutation of the ranks, so
a solution that assumes root 0, or gets the rank relative to the root wrong, is caught on every
size. Timed repetitions reuse trial 0's root. Every rank's `sendbuf` holds different data, so a
rank that copies its own input instead of receiving the root's is caught too.
"""

from __future__ import annotations

import numpy as np

from .base import Case, Op, Trial, full_random


class Bcast(Op):
    name = "bcast"
    exact = True

    def args(self, params):
        return ["sendbuf", "recvbuf"]

    def _trial(self, rng, count, dtype, world, root: int) -> Trial:
        inputs = [{"sendbuf": full_random(rng, (count,), dtype)} for _ in range(world)]
        outputs = [{"recvbuf": ((count,), dtype)} for _ in range(world)]
        extra = [{"root": int(root)} for _ in range(world)]
        return Trial(inputs, outputs, extra, [0.0] * world)

    def make_trial(self, rng, count, dtype, world, params):
        return self._trial(rng, count, dtype, world, int(rng.integers(world)))

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        roots = rng.permutation(world).tolist()
        while len(roots) < trials:
            roots.append(int(rng.integers(world)))
        made = [self._trial(rng, count, dtype, world, root) for root in roots]
        return Case(case_id, count, dtype, world, dict(params), self.args(params), made, op=self)

    def expected(self, trial, count, dtype, world, params):
        root = trial.extra[0]["root"]
        data = trial.inputs[root]["sendbuf"].copy()
        return [{"recvbuf": data} for _ in range(world)]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


OPS = {"bcast": Bcast()}
