"""A call as the observer makes it (`Call`: what it is, when each rank was seen at each
step) and `JobEnded`, the end of a job the observer stops at; shared by the observer and the
two sides that reach the ranks (`observer_local`, `cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .checks.base import Trial
from .observer_phases import Timing
from .verdicts import Verdict


class JobEnded(Exception):
    """The job ended (or must end) before the observer was done with it."""

    def __init__(self, verdict: Verdict, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.verdict, self.message, self.detail = verdict, message, detail


@dataclass
class Call:
    """One call on every rank (or a batch of calls back to back) while the observer makes it:
    what it is, and when the observer saw each rank's steps of it."""

    k: int  # the call's number in the job
    trials: list[Trial]  # one per call of the batch
    check: bool
    # each rank's outputs taken at its own completion (see Observer.call)
    own: bool
    world: int
    # the ranks in the order their gates open (by their delays)
    order: list[int]
    # staged: the late ranks, prepared at their gate
    late: set[int]
    gate: list[float] = field(init=False)
    done: list[float] = field(init=False)
    left: set[int] = field(init=False)  # the ranks not seen done yet
    # own completion: when each rank was told to fetch, when it said it had saved, and
    # its outputs as they were then (the host backend: when it said it was done)
    fetched: list[float] = field(init=False)
    saved: list[float] = field(init=False)
    taken: list[dict[str, np.ndarray] | None] = field(init=False)
    before: float = 0.0  # the untimed phases (see Timing)
    after: float = 0.0

    def __post_init__(self) -> None:
        n = self.world
        self.gate, self.done, self.fetched, self.saved = ([0.0] * n for _ in range(4))
        self.left = set(range(self.world))
        self.taken = [None] * self.world

    @property
    def trial(self) -> Trial:
        """The first call's trial: its delays are the call's."""
        return self.trials[0]

    @property
    def batch(self) -> int:
        return len(self.trials)

    def timing(self) -> Timing:
        """The time of one call (last done - last gate, over the batch's size) and the
        untimed phases around it, likewise per call."""
        return Timing((max(self.done) - max(self.gate)) / self.batch, self.before / self.batch,
                      self.after / self.batch)
