"""The timing policy of a case: which calls the observer makes of it (trials, the stress
phase, warm-up, timed repetitions, batches of back-to-back calls) and when it stops.

`CaseSchedule` is a part of `observer.Observer`: it makes its calls with the observer's
`call`, on the observer's ranks, with its generator and settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .checks.base import Case, Op, Trial
from .observer_checks import WrongAnswer
from .observer_phases import Timing

WARMUP_S = 0.02  # warm-up calls of a case fill at least this long ...
MAX_WARMUP_CALLS = 200  # ... with at most this many
MIN_REPS = 3  # timed repetitions of a case at least, whatever the observer's own time
# small sizes: a timed repetition is a batch of back-to-back calls lasting at least BATCH_S
# (by the warm-up's time per call), of at most MAX_BATCH calls whose buffer sets take at
# most BATCH_BYTES of a rank's segment; the gate, the "done" and the observer's wake-up are
# then paid once per batch, not once per call
BATCH_S = 1e-3
MAX_BATCH = 128
BATCH_BYTES = 64 << 20
DRAWS = 20  # batches drawn at most for one whose inputs fit the feeds
TRIAL_BATCHES = 3  # trial batches timed per step of the batch size's growth
# the stress phase: its calls' outputs may take at most STRESS_BYTES of a rank's segment (and
# their inputs its feed); a call after the first holds one rank back with probability
# STRESS_HOLD_P, for STRESS_HOLD_S seconds (drawn in that range), on the host or its device
STRESS_BYTES = 256 << 20
STRESS_HOLD_P = 0.5
STRESS_HOLD_S = (100e-6, 2e-3)
# the first call of a case: its held rank's stream waits this long (drawn in the range), set
# before the call begins, so it must outlast the set-up work a call on new buffers does on
# the host first (exchanging and opening IPC handles takes milliseconds)
FIRST_HOLD_S = (10e-3, 40e-3)


def footprint(trials: list[Trial], world: int) -> tuple[int, int]:
    """The most bytes any rank needs for these calls back to back: (outputs, which take its
    segment; inputs, which go through its feed)."""
    outs = max(sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                   for t in trials for shape, dtype in t.outputs[r].values())
               for r in range(world))
    ins = max(sum(a.nbytes for t in trials for a in t.inputs[r].values()) for r in range(world))
    return outs, ins


class CaseSchedule:
    """The calls of one case, made through the observer's `call` (see `observer.Observer`)."""

    # what the observer holds that the schedule reads (set in Observer.__init__)
    world: int
    op: Op
    s: Any  # observer.Settings
    rng: np.random.Generator
    staged: bool
    timed: bool
    trials: bool
    batch: bool
    batches: dict[str, int]
    ranks: list
    where: str
    case_no: int
    call: Callable[..., Timing]  # one call, or a batch of them, on every rank

    def run_case(self, case: Case) -> list[Timing]:
        """Trials, warm-up and timed repetitions of one case; returns the repetitions' times.
        Raises WrongAnswer with every message labelled by the call it came from."""
        label = f"count={case.count} {case.dtype}"
        where = ""
        self.where = f"case {case.id} ({label}), "
        self.case_no += 1
        for r in self.ranks:  # every case begins with a new layout (the ranks' new buffers)
            r.placed = []
        times: list[Timing] = []
        try:
            checking = self.trials or not self.timed
            for t, trial in enumerate(case.trials if checking else []):
                where = f"trial {t}"
                self.call(case, trial, check=True, own_completion=True,
                          holds=self._first_hold(case, t, trial), scrub=True)
            if checking and self.s.stress > 1:
                where = "calls back to back"
                self.stress(case)
            if self.timed and self.s.reps > 0:
                where = "warm-up"
                last = self.op.timed_trial(self.rng, case)
                batch = self._warm_up(case, last)
                began, spent = time.perf_counter(), 0.0
                while True:
                    where = f"timed repetition {len(times)}"
                    times.append(self.call(case, self._draw(case, batch), check=True))
                    spent += times[-1].call * batch
                    if self._enough(len(times), spent, time.perf_counter() - began):
                        break
            elif self.s.reps > 0:
                # untimed (template, mutants): still a few calls on fresh inputs
                for n in range(min(self.s.reps, 3)):
                    where = f"repetition {n}"
                    self.call(case, self.op.timed_trial(self.rng, case), check=True)
        except WrongAnswer as exc:
            raise WrongAnswer([f"[{label}, {where}] {m}" for m in exc.errors]) from None
        return times

    def _warm_up(self, case: Case, last: Trial) -> int:
        """The untimed calls before a case's timed repetitions; returns the calls per timed
        batch (the item's, where an earlier job chose it; chosen here otherwise)."""
        # the first call pays what is paid once (connections set up, code compiled):
        # the warm-up fills WARMUP_S after it
        warm = [self.call(case, last, check=False).call]
        while len(warm) < max(self.s.warmup, 2) or (
                len(warm) <= MAX_WARMUP_CALLS and sum(warm[1:]) < WARMUP_S):
            warm.append(self.call(case, last, check=False).call)
        batch = self.batches.get(case.id)
        if batch is None:
            batch = self.batches[case.id] = self._batch_size(
                case, last, float(np.median(warm[1:])))
        elif batch > 1:  # the batch's buffer sets, touched once before they are timed
            self.call(case, self._draw(case, batch), check=False)
        return batch

    def _enough(self, reps: int, spent: float, wall: float) -> bool:
        """Whether the timed repetitions may stop: `reps` made, `spent` seconds timed, `wall`
        seconds since the first began."""
        if reps >= self.s.reps and (spent >= self.s.timing_budget or reps >= self.s.max_reps
                                    or wall >= self.s.wall_s):
            return True
        # the largest sizes: drawing, writing and checking fresh inputs costs
        # the observer seconds a call; bandwidth-bound calls vary little
        return reps >= MIN_REPS and wall >= self.s.wall_s

    def _first_hold(self, case: Case, t: int, trial: Trial) -> list | None:
        """The first call of a case (where every rank's buffers are new, so all are prepared
        together): one rank, drawn at random, held back on its device (its stream waits)
        after its call has begun, where the ranks can be (a staged backend, the stress phase
        on). With each rank's inputs poisoned the moment its own call is complete (`scrub`),
        a peer that passes its closing barrier before the held rank has read its inputs is
        caught, whatever its flags held from the calls before (an epoch restarted with the
        size, a barrier that trusts a stale flag), and so is one whose outputs a peer
        completes after its own call (outputs are taken at each rank's own completion, as
        in a late trial). Only where the task has late trials (a peer-completed output is
        no fault where its contract says a peer writes it)."""
        if (t != 0 or not self.staged or self.s.stress <= 1 or not case.late
                or any(trial.delays)):
            return None
        return [(int(self.rng.integers(self.world)), float(self.rng.uniform(*FIRST_HOLD_S)),
                 "device")]

    def stress(self, case: Case) -> bool:
        """The stress phase: `Settings.stress` calls made back to back on every rank, with no
        gate, "done" or fetch between them (as a training loop makes them), each on a buffer
        set of its own with its inputs written just before it, one rank held back on the host
        or on its device before some of them; every output of every call checked. What one
        gated call at a time hides fails here: a barrier dropped after the first calls, flags
        or epochs that go wrong when a peer is a call ahead, scratch a peer overwrites while
        this rank still reads it. Only where the calls fit (segment, feed) and the op's check
        allows batches; False where the case was not stressed."""
        if not self.op.batchable:
            return False
        trials = self._stress_trials(case)
        if trials is None:
            return False
        n = len(trials)
        holds = self._stress_holds(n)
        try:
            self.call(case, trials, check=True, holds=holds)
        except WrongAnswer as exc:
            said = "; ".join(f"call {j + 1}: rank {h[0]} held {1e6 * h[1]:.0f} us on its {h[2]}"
                             for j, h in enumerate(holds) if h)
            raise WrongAnswer([f"{m} ({n} calls back to back with no synchronization between "
                               f"them{'; ' + said if said else ''})" for m in exc.errors]
                              ) from None
        return True

    def _stress_trials(self, case: Case) -> list[Trial] | None:
        """The stress phase's calls: `Settings.stress` of them, halved until they fit the
        ranks' segments and feeds (None: fewer than 2 fit, or a call holds a rank back
        itself)."""
        room = min(r.feed_bytes for r in self.ranks)
        n = self.s.stress
        while n >= 2:
            trials = [self.op.timed_trial(self.rng, case) for _ in range(n)]
            if any(d for t in trials for d in t.delays):
                return None
            outs, ins = footprint(trials, self.world)
            if outs <= STRESS_BYTES and ins <= room:
                return trials
            n //= 2
        return None

    def _stress_holds(self, n: int) -> list:
        """Per call of the stress phase, None or the rank held back before it: (rank,
        seconds, "host" | "device"); never before the first."""
        holds: list = [None]
        for _ in range(n - 1):
            held = self.rng.random() < STRESS_HOLD_P
            holds.append((int(self.rng.integers(self.world)),
                          float(self.rng.uniform(*STRESS_HOLD_S)),
                          "device" if self.staged and self.rng.random() < 0.5 else "host")
                         if held else None)
        return holds

    def _draw(self, case: Case, batch: int) -> Trial | list[Trial]:
        """Fresh inputs for a timed repetition: one trial, or one per call of a batch."""
        if batch <= 1:
            return self.op.timed_trial(self.rng, case)
        room = min(r.feed_bytes for r in self.ranks)
        for _ in range(DRAWS):
            trials = [self.op.timed_trial(self.rng, case) for _ in range(batch)]
            if footprint(trials, self.world)[1] <= room:
                return trials
        raise RuntimeError(f"{DRAWS} batches of {batch} calls drawn, none fits the ranks' "
                           f"feeds ({room} bytes)")

    def _batch_size(self, case: Case, trial: Trial, per_call: float) -> int:
        """Calls per timed batch: grown from the warm-up's time per call (which is mostly
        the gate's and the "done"'s cost where calls are short) by timing trial batches until
        one lasts BATCH_S, within MAX_BATCH, BATCH_BYTES of outputs and the ranks' feeds (1:
        no batching here, or a call that is long already). The trial batches also warm the
        buffer sets."""
        if not self.batch or per_call <= 0 or per_call >= BATCH_S:
            return 1
        # in the segment: the outputs (the inputs go through the feed); a call's inputs may
        # vary in size (MoE routing is drawn per call): room for twice the warm-up's in the
        # feed, and a batch that would still not fit is drawn again
        per_set, fed = footprint([trial], self.world)
        most = max(1, min(MAX_BATCH, BATCH_BYTES // max(per_set, 1),
                          min(r.feed_bytes for r in self.ranks) // max(2 * fed, 1)))
        batch = max(1, min(most, int(np.ceil(BATCH_S / per_call))))
        while batch > 1:
            # the fastest of a few: a batch of calls of microseconds that met a scheduler
            # tick would stop the growth where the calls are still mostly the gate's cost
            took = min(self.call(case, self._draw(case, batch), check=False).call
                       for _ in range(TRIAL_BATCHES)) * batch
            if took >= BATCH_S or batch >= most:
                break
            batch = min(most, max(batch + 1, int(np.ceil(batch * BATCH_S / max(took, 1e-9)))))
        return batch
