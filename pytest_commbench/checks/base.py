"""The contract of a correctness oracle, and the pieces every oracle shares.

An Op makes the inputs of one case from the harness's secret random generator, says which
output buffers each rank gets, and decides whether what the ranks wrote is right. It runs in
the controller only: the ranks never see the oracle, the seed or the expected values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..poison import poison_value
from ..rank.draws import FLOAT_KINDS, drawn


@dataclass
class Trial:
    """Inputs and output layout of one call, for every rank."""

    inputs: list[dict[str, np.ndarray]]  # [rank] -> name -> array
    outputs: list[dict[str, tuple[tuple[int, ...], str]]]  # [rank] -> name -> (shape, dtype)
    extra: list[dict[str, Any]] = field(default_factory=list)  # [rank] -> context values
    delays: list[float] = field(default_factory=list)  # [rank] -> seconds slept before the call


@dataclass
class Case:
    """One size and dtype of a task: several trials on fresh inputs, then timed repetitions."""

    id: str
    count: int
    dtype: str
    world: int
    params: dict[str, Any]
    args: list[str]
    trials: list[Trial]
    # the oracle that made the case: `make_late` draws the case's extra late trials from it
    op: Any = field(default=None, repr=False, compare=False)
    # late trials were added (`make_late`): the task's ranks own their buffers only during
    # their own call, and each rank's outputs may be taken at its own completion
    late: bool = False


LATE_S = 2e-3  # how late the held rank of a late trial is (`make_late`)
CHUNK = 1 << 20  # elements compared at a time: cache-sized pieces, no array-sized temporaries


def _mismatches(got: np.ndarray, want: np.ndarray, rtol: float, atol) -> tuple[int, int]:
    """(number of elements out of tolerance, index of the first) over the flattened arrays,
    a chunk at a time (several times faster than one whole-array isclose at 10^8 elements).
    `atol` is a number or an array of the outputs' shape (a per-element error bound)."""
    g, w = got.reshape(-1), want.reshape(-1)
    per_element = isinstance(atol, np.ndarray)
    tol_all = atol.reshape(-1) if per_element else None
    floats = got.dtype.kind in FLOAT_KINDS or want.dtype.kind in FLOAT_KINDS
    count, first = 0, -1
    for lo in range(0, g.size, CHUNK):
        a, b = g[lo:lo + CHUNK], w[lo:lo + CHUNK]
        tol = tol_all[lo:lo + CHUNK] if per_element else atol
        if not floats or (rtol == 0 and not per_element and atol == 0):
            ok = a == b  # exact: NaN (the float poison) never equals anything
        else:
            # |a - b| <= atol + rtol * |b| in float64 (as numpy.isclose, without its
            # overheads); a NaN (the float poison) compares false
            b64 = b.astype(np.float64)
            diff = a.astype(np.float64)
            diff -= b64
            np.abs(diff, out=diff)
            np.abs(b64, out=b64)
            b64 *= rtol
            b64 += tol
            ok = diff <= b64
        if not ok.all():
            bad = np.flatnonzero(~ok)
            count += int(bad.size)
            if first < 0:
                first = lo + int(bad[0])
    return count, first


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol) -> str | None:
    """None when equal within tolerance, else one sentence saying where and how it differs."""
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return None
    nbad, first = _mismatches(got, want, rtol, atol)
    if not nbad:
        return None
    g0 = got.reshape(-1)[first]
    w0 = want.reshape(-1)[first]
    poison = poison_value(got.dtype)
    never = (np.isnan(g0) if got.dtype.kind in FLOAT_KINDS else g0 == poison)
    note = " (poison: the element was never written)" if never else ""
    index = tuple(int(i) for i in np.unravel_index(first, got.shape)) if got.ndim > 1 else first
    return (
        f"{nbad} of {got.size} elements wrong; first at index {index}: "
        f"got {g0.item()!r}, expected {w0.item()!r}{note}"
    )


class Op:
    """Base oracle: inputs from `make_trial`, expected outputs from `expected`, exact or
    tolerant comparison of every output of every rank."""

    name = ""
    #: pure data movement: compare bit for bit, whatever the manifest's tolerances say
    exact = False

    def args(self, params: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def make_trial(self, rng: np.random.Generator, count: int, dtype: str, world: int,
                   params: dict[str, Any]) -> Trial:
        raise NotImplementedError

    def expected(self, trial: Trial, count: int, dtype: str, world: int,
                 params: dict[str, Any]) -> list[dict[str, np.ndarray]]:
        raise NotImplementedError

    def bytes(self, count: int, dtype: str, world: int, params: dict[str, Any]) -> tuple[int, float]:
        """(bytes moved as nccl-tests counts the size, bus-bandwidth factor)."""
        return count * np.dtype(dtype).itemsize, 1.0

    def verify(self, trial: Trial, got: list[dict[str, np.ndarray]], events: list[dict[str, float]],
               case: Case, rtol: float, atol: float, want=None, slack=None) -> list[str]:
        """Messages for every wrong output; empty when all ranks are right. `want` (and
        `slack`) are the expected outputs (and error bounds) when the caller computed them."""
        if want is None:
            want = self.expected(trial, case.count, case.dtype, case.world, case.params)
        if slack is None and not self.exact:
            slack = self.slack(trial, case)
        errors = []
        for rank, (w_rank, g_rank) in enumerate(zip(want, got)):
            for name, w in w_rank.items():
                if name not in g_rank:
                    errors.append(f"rank {rank}: output '{name}' missing")
                    continue
                tol = 0.0 if self.exact else atol
                if slack is not None and name in slack[rank]:
                    tol = atol + slack[rank][name]
                msg = compare(g_rank[name], w, 0.0 if self.exact else rtol, tol)
                if msg:
                    errors.append(f"rank {rank}: output '{name}': {msg}")
        return errors

    def slack(self, trial: Trial, case: Case) -> list[dict[str, np.ndarray]] | None:
        """Per-element absolute error an honest computation in the output's dtype may make,
        added to the manifest's atol (reductions: the rounding bound of a sum in any order)."""
        return None

    # -- shared helpers ------------------------------------------------------------------
    def make_case(self, rng: np.random.Generator, case_id: str, count: int, dtype: str,
                  world: int, params: dict[str, Any], trials: int, reps: int) -> Case:
        made = [self.make_trial(rng, count, dtype, world, params) for _ in range(trials)]
        for t in made:
            if not t.extra:
                t.extra = [{} for _ in range(world)]
            if not t.delays:
                t.delays = [0.0] * world
        return Case(case_id, count, dtype, world, dict(params), self.args(params), made, op=self)

    def timed_trial(self, rng: np.random.Generator, case: Case) -> Trial:
        """The inputs of one timed repetition: drawn afresh like a trial's (never a shift or
        a rerun of earlier inputs, so nothing learnt from earlier calls gives the answer)."""
        try:
            trial = self.make_trial(rng, case.count, case.dtype, case.world, case.params)
        except NotImplementedError:  # trials made together in make_case: draw a case of one
            trial = self.make_case(rng, case.id, case.count, case.dtype, case.world,
                                   case.params, 1, 0).trials[0]
        if not trial.extra:
            trial.extra = [{} for _ in range(case.world)]
        if not trial.delays:
            trial.delays = [0.0] * case.world
        return trial

    # timed repetitions of small sizes may be batches of back-to-back calls (an op whose
    # check needs each call's own entry and exit times, a barrier's, may not)
    batchable = True

    @property
    def samples_outputs(self) -> bool:
        """Whether expected() gives every output element (so positions can be spot-checked
        the moment a rank says it is done)."""
        return type(self).verify is Op.verify



def held_ranks(index: int, world: int) -> list[int]:
    """The ranks held back (one late trial each, in this order) in case `index` of an item,
    its cases numbered from 0 in the order the item makes them (the manifest's sizes, each
    with its dtypes: case 0 is the first size, the smallest in every task of the suite).
    Case 0 holds every rank in turn and case i > 0 holds rank i mod world: whatever the
    number of cases, every rank is held at least once per item, so a solution that leaves
    one rank's work to another is caught whichever rank it leans on, not by luck; the extra
    late trials are all on the smallest size (cheap), and each larger size, whose trials
    cost the most, keeps its single late trial, on a held rank that rotates over the sizes."""
    if world < 2:
        return []
    return list(range(world)) if index == 0 else [index % world]


def case_index(case: Case) -> int:
    """The case's place among its item's cases, from its id ("c<n>", as the runner names
    them); 0 for an id of another form (every rank is then held: `held_ranks`)."""
    m = re.fullmatch(r"c(\d+)", case.id)
    return int(m.group(1)) if m else 0


def make_late(case: Case, rng: np.random.Generator, index: int | None = None) -> None:
    """Late trials (where the op set no delays itself and the case has several trials): the
    last trial, and on the item's first case one more trial for every other rank, each on
    inputs drawn afresh, open one rank's gate LATE_S after the others' (`held_ranks` says
    which), and that rank's inputs are written (on a GPU also uploaded, its outputs poisoned)
    only then: a solution that reads a peer's inputs or writes into its outputs before the
    peer's call began is wrong there, as it would be in a real program. `index`: the case's
    position in the item (default: read from its id, `c<n>`). There each rank's
    outputs are also taken at its own completion (staged backends: fetched the moment it says
    it is done; the host backend: copied then), not once the held rank is done too: a rank
    whose outputs a peer completes later, after the held rank's release, is wrong there."""
    if case.world < 2 or len(case.trials) < 2 or any(any(t.delays) for t in case.trials):
        return
    case.late = True
    held = held_ranks(case_index(case) if index is None else index, case.world)
    if len(held) > 1 and case.op is None:  # nothing to draw fresh inputs from: the last only
        held = held[:1]
    case.trials[-1].delays[held[0]] = LATE_S
    for rank in held[1:]:
        trial = case.op.timed_trial(rng, case)  # inputs drawn afresh, never a repeat
        trial.delays = [0.0] * case.world
        trial.delays[rank] = LATE_S
        case.trials.append(trial)


def full_random(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Values that use every bit of the dtype's significand (`draws.full_random`), drawn
    with a recipe a node agent can draw again (read-only)."""
    return drawn(rng, "full", shape, dtype)


def sum_slack(inputs: list[np.ndarray], dtype: str) -> np.ndarray:
    """The rounding error bound of a sum of these arrays (element-wise) computed in `dtype` in
    any order: (n - 1) * unit roundoff * sum of magnitudes, doubled for slack (the sum of
    magnitudes itself taken in float32 at least: its own rounding is far inside the doubling)."""
    dt = np.dtype(dtype)
    if dt.kind not in FLOAT_KINDS:
        return np.zeros(inputs[0].shape)
    acc = np.result_type(dt, np.float32)
    mag = np.abs(inputs[0]).astype(acc)
    for x in inputs[1:]:
        mag += np.abs(x)
    mag *= acc.type(2.0 * max(len(inputs) - 1, 1) * float(np.finfo(dt).eps))
    return mag


def random_data(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Values exactly representable in the dtype, different on every element
    (`draws.random_data`), drawn with a recipe a node agent can draw again (read-only)."""
    return drawn(rng, "data", shape, dtype)
