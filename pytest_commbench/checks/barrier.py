"""Barrier: no rank leaves before the last rank has entered.

The harness sleeps a chosen rank before it enters, records when each rank entered and left
(a clock shared by all processes of the host), and checks exit >= every entry. One trial per
rank delays that rank, so a barrier that forgets any one peer's arrival is caught.
"""

from __future__ import annotations

import numpy as np

from .base import Case, Op, Trial

DELAY_S = 0.05
# timed calls: one rank late by a delay drawn log-uniformly in this range, so a "barrier"
# that only sleeps must sleep longer than the longest delay on every call (and is timed so)
TIMED_DELAY_S = (5e-6, 2e-3)


class Barrier(Op):
    name = "barrier"
    batchable = False  # every call's entries and exits are checked

    def args(self, params):
        return []

    def make_trial(self, rng, count, dtype, world, params):
        raise NotImplementedError  # trials are made in make_case: one late rank per trial

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        order = rng.permutation(world).tolist()
        made = []
        for late in order[: max(trials, world)]:
            delays = [0.0] * world
            delays[late] = DELAY_S
            made.append(Trial([{} for _ in range(world)], [{} for _ in range(world)],
                              [{} for _ in range(world)], delays))
        return Case(case_id, count, dtype, world, dict(params), [], made, op=self)

    def timed_trial(self, rng, case):
        """One rank, chosen afresh, enters late by a delay drawn afresh, so every timed call is
        checked too (a barrier that does not wait leaves before the late rank entered)."""
        delays = [0.0] * case.world
        lo, hi = np.log(TIMED_DELAY_S[0]), np.log(TIMED_DELAY_S[1])
        delays[int(rng.integers(case.world))] = float(np.exp(rng.uniform(lo, hi)))
        return Trial([{} for _ in range(case.world)], [{} for _ in range(case.world)],
                     [{} for _ in range(case.world)], delays)

    def expected(self, trial, count, dtype, world, params):
        return [{} for _ in range(world)]

    def verify(self, trial, got, events, case, rtol, atol):
        last_entry = max(e["t_enter"] for e in events)
        late = max(range(len(events)), key=lambda r: events[r]["t_enter"])
        errors = []
        for rank, e in enumerate(events):
            if e["t_exit"] < last_entry:
                errors.append(
                    f"rank {rank} left the barrier {1e3 * (last_entry - e['t_exit']):.1f} ms "
                    f"before rank {late} entered it"
                )
        return errors

    def bytes(self, count, dtype, world, params):
        return 0, 1.0


OPS = {"barrier": Barrier()}
