"""The observer's checks of a call's outputs: the spot check of a rank's outputs the moment it
says it is done (an early "done" is a wrong answer), and every output of every call against
the oracle before the next call; `WrongAnswer` carries what they found."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .checks.base import Case, Op, Trial, compare
from .observer_wire import Rank
from .rank.protocol import batch_sets, views

SAMPLES = 16  # positions per output checked the moment a rank says it is done


class WrongAnswer(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__(errors[0] if errors else "")
        self.errors = errors


def expected_outputs(op: Op, case: Case, trials: list[Trial], check: bool
                     ) -> tuple[list, list]:
    """Per call, the outputs the oracle expects and the slack it allows (None each where the
    call is not checked or the op's outputs are not spot-checked)."""
    wants: list = [None] * len(trials)
    slacks: list = [None] * len(trials)
    if check and op.samples_outputs:
        wants = [op.expected(t, case.count, case.dtype, case.world, case.params)
                 for t in trials]
        slacks = [None if op.exact else op.slack(t, case) for t in trials]
    return wants, slacks


def spot_check(rank: Rank, want: dict[str, np.ndarray], slack: dict[str, np.ndarray],
               rng: np.random.Generator, exact: bool, rtol: float, atol: float,
               j: int = 0, batch: int = 1) -> list[str]:
    """Outputs at positions drawn now, the moment the rank said it was done (call j of
    a batch of calls: its buffer set)."""
    number = rank.number
    v = batch_sets(views(rank.data, rank.placed), batch)[j]
    errors = []
    which = f" (call {j + 1} of {batch} back to back)" if batch > 1 else ""
    for name, w in want.items():
        got = v.get(name)
        w = np.asarray(w)
        if got is None or got.shape != w.shape or got.size == 0:
            continue
        idx = rng.integers(0, got.size, size=min(SAMPLES, got.size))
        g = got.reshape(-1)[idx].copy()
        tol = 0.0 if exact else atol
        if not exact and name in slack:
            tol = tol + np.asarray(slack[name]).reshape(-1)[idx]
        msg = compare(g, w.reshape(-1)[idx], 0.0 if exact else rtol, tol)
        if msg:
            errors.append(f"rank {number}: output '{name}'{which} was not complete when "
                          f"the rank said it was done (spot check of {idx.size} positions: "
                          f"{msg})")
    return errors


def verify_calls(op: Op, case: Case, trials: list[Trial],
                 outputs: Callable[[int], list[dict[str, np.ndarray]]], events: list[dict],
                 wants: list, slacks: list, rtol: float, atol: float) -> list[str]:
    """Every call's outputs (`outputs(j)`: call j's, per rank) against the oracle; each
    message labelled by its call where there was a batch of them."""
    batch = len(trials)
    errors = []
    for j, (t, want, slack) in enumerate(zip(trials, wants, slacks)):
        got = outputs(j)
        try:
            if want is not None:
                found = op.verify(t, got, events, case, rtol, atol, want=want, slack=slack)
            else:
                found = op.verify(t, got, events, case, rtol, atol)
        except Exception as exc:  # noqa: BLE001 - outputs an oracle cannot even read
            found = [f"the outputs could not be checked ({type(exc).__name__}: "
                     f"{str(exc)[:200]})"]
        errors += [f"call {j + 1} of {batch} back to back: {m}" if batch > 1 else m
                   for m in found]
    return errors


def held_back(errors: list[str], trial: Trial, holds: list | None, world: int) -> list[str]:
    """The messages of a call whose outputs were taken at each rank's own completion, each
    saying which rank was held back and how long."""
    if any(trial.delays):
        held = ", ".join(str(i) for i in range(world) if trial.delays[i] > 0)
        why = f"rank {held} held back {1e3 * max(trial.delays):g} ms"
    else:
        h = holds[0]
        why = f"rank {h[0]}'s stream held back {1e3 * h[1]:.1f} ms on its device"
    return [f"{m} ({why}; every rank's outputs as they were when its own call completed)"
            for m in errors]
