"""The stress phase: calls back to back with no synchronization between them, a rank held
back before some (observer.Observer.stress).

Driven through the observer with rank threads that run the real rank loop (`Calls`) over
the host and the staged host backends (tests/unit/test_late_rank.py). A two-barrier all-reduce
over a scratch slot per rank, reused from call to call (as an IPC workspace is), passes one
gated call at a time whether or not it keeps its closing barrier; made back to back, the
one that drops it after its first calls lets a fast rank overwrite its slot while a slower
peer still reads it, and is a wrong answer naming the calls. The honest one passes; the
holds the observer draws reach the ranks they name.

Each rank's inputs are poisoned the moment its own call is complete (the case's trials): an
all-reduce that reads its peers' inputs where they lie (zero copy) and leaves without its
closing barrier passes with the inputs left in place, and reads poison with them scrubbed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_late_rank import ranks_in_threads

from pytest_commbench import checks
from pytest_commbench.checks.base import make_late
from pytest_commbench.observer import Observer, Settings, WrongAnswer


class Scratch:
    """Per rank a scratch slot its peers read (an IPC workspace), and per call counters of
    the ranks that have posted into their slot and of those done reading."""

    def __init__(self, world: int, count: int) -> None:
        self.cond = threading.Condition()
        self.slots = [np.zeros(count, np.float64) for _ in range(world)]
        self.posted: dict[int, int] = {}
        self.read: dict[int, int] = {}

    def arrive(self, table: dict[int, int], call: int, world: int) -> None:
        with self.cond:
            table[call] = table.get(call, 0) + 1
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: table[call] >= world, timeout=20):
                raise RuntimeError(f"call {call}: the peers never arrived")


def _allreduce(kind: str, rank: int, world: int, scratch: Scratch):
    """honest: post into its slot, wait for every post, read every slot, wait until every
    rank has read (the closing barrier: only then may a slot be written again).
    drops_barrier: the same, without the closing barrier after its first two calls (they
    were made one at a time, and passed). Rank r reads for 2 + 20 r ms (a slower kernel on a
    busier GPU): the fast rank's next post lands in a slot the slow one still reads, with
    20 ms to spare for a loaded machine's scheduling."""
    calls = [0]

    def solution(ctx, sendbuf, recvbuf):
        calls[0] += 1
        call = calls[0]
        scratch.slots[rank][:] = sendbuf
        scratch.arrive(scratch.posted, call, world)
        time.sleep(0.002 + 0.02 * rank)
        total = np.sum([s for s in scratch.slots], axis=0)
        recvbuf[...] = total.astype(recvbuf.dtype)
        if kind == "honest" or call <= 2:
            scratch.arrive(scratch.read, call, world)

    return solution


def _judge(tmp_path: Path, kind: str, staged: bool, world: int = 2, stress: int = 6,
           holds_seen: list | None = None) -> list[str]:
    rng = np.random.default_rng(5)
    op = checks.get("allreduce")
    case = op.make_case(rng, "c0", 257, "float32", world, {}, 2, 0)
    make_late(case, rng)  # as the runner makes a task's cases (late_rank = true)
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=1e-6, atol=1e-6, stress=stress)
    job_dir = tmp_path / f"job-{kind}-{staged}-{world}-{stress}"
    job_dir.mkdir()
    obs = Observer(job_dir, world, op, settings, np.random.default_rng(6), staged=staged,
                   timed=False)
    scratch = Scratch(world, 257)
    drawn: list = []
    real_call = obs.call

    def call(*args, **kw):
        if kw.get("holds"):
            drawn.append(kw["holds"])
        return real_call(*args, **kw)

    obs.call = call
    held: list = []

    def hold_device(rank):
        return lambda seconds: held.append((rank, seconds))

    with ranks_in_threads(obs, job_dir, case, staged,
                          lambda rank: _allreduce(kind, rank, world, scratch),
                          hold_device=hold_device):
        try:
            obs.run_case(case)
        except WrongAnswer as exc:
            return exc.errors
    if holds_seen is not None:
        holds_seen.extend([drawn, held])
    return []


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_a_barrier_dropped_after_the_first_calls_passes_gated_calls_only(tmp_path, staged):
    assert _judge(tmp_path, "drops_barrier", staged, stress=0) == []
    errors = _judge(tmp_path, "drops_barrier", staged)
    assert errors, "the dropped barrier passed the stress phase"
    assert "back to back with no synchronization" in errors[0], errors[0]


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_an_honest_solution_passes_the_stress_phase(tmp_path, staged):
    assert _judge(tmp_path, "honest", staged) == []
    assert _judge(tmp_path, "honest", staged, world=4) == []


def test_the_holds_drawn_reach_the_ranks_they_name(tmp_path):
    seen: list = []
    assert _judge(tmp_path, "honest", True, world=4, stress=8, holds_seen=seen) == []
    drawn, held = seen
    # the case's first call (one rank held on its device), then the batch of 8
    assert len(drawn) == 2 and len(drawn[0]) == 1 and drawn[0][0][2] == "device"
    assert len(drawn[1]) == 8 and drawn[1][0] is None
    device = sorted((h[0], h[1]) for batch in drawn for h in batch if h and h[2] == "device")
    assert sorted(held) == device
    assert any(h for h in drawn[1]), "no call was held back"


def _zero_copy(kind: str, rank: int, world: int, scratch: Scratch):
    """Reads every peer's sendbuf where it lies after an opening barrier; honest: waits at a
    closing barrier until every rank has read; no_closing_barrier: leaves at once. Rank r
    reads 2 + 20 r ms after the opening barrier (a slower kernel on a busier GPU)."""
    calls = [0]

    def solution(ctx, sendbuf, recvbuf):
        calls[0] += 1
        call = calls[0]
        scratch.slots[rank] = sendbuf  # where a peer reads it (a mapped buffer)
        scratch.arrive(scratch.posted, call, world)
        time.sleep(0.002 + 0.02 * rank)
        recvbuf[...] = np.sum([np.array(s, np.float64) for s in scratch.slots],
                              axis=0).astype(recvbuf.dtype)
        if kind == "honest":
            scratch.arrive(scratch.read, call, world)

    return solution


def _judge_scrub(tmp_path: Path, kind: str, staged: bool, scrub: bool) -> list[str]:
    rng = np.random.default_rng(5)
    op = checks.get("allreduce")
    case = op.make_case(rng, "c0", 257, "float32", 2, {}, 2, 0)
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=1e-6, atol=1e-6, stress=0)
    job_dir = tmp_path / f"job-{kind}-{staged}-{scrub}"
    job_dir.mkdir()
    obs = Observer(job_dir, 2, op, settings, np.random.default_rng(6), staged=staged,
                   timed=False)
    if not scrub:
        real_call = obs.call
        obs.call = lambda *a, **kw: real_call(*a, **{**kw, "scrub": False})
    scratch = Scratch(2, 257)
    with ranks_in_threads(obs, job_dir, case, staged,
                          lambda rank: _zero_copy(kind, rank, 2, scratch)):
        try:
            obs.run_case(case)
        except WrongAnswer as exc:
            return exc.errors
    return []


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_inputs_poisoned_at_completion_catch_a_missing_closing_barrier(tmp_path, staged):
    assert _judge_scrub(tmp_path, "honest", staged, scrub=True) == []
    # without the scrub the inputs stay in place until the next call: the bug is invisible
    assert _judge_scrub(tmp_path, "no_closing_barrier", staged, scrub=False) == []
    errors = _judge_scrub(tmp_path, "no_closing_barrier", staged, scrub=True)
    assert errors and "trial 0" in errors[0] and "rank 1" in errors[0], errors
