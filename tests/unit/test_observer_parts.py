"""The observer's parts on their own, in milliseconds: the case schedule driven through a fake
`call`, the wire's reading of what a rank says, the checks' messages, and the names other
modules import from `observer`."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_commbench import checks, observer, observer_checks, observer_phases, observer_wire
from pytest_commbench.observer import Call, Settings, Timing, WrongAnswer
from pytest_commbench.observer_schedule import MIN_REPS, CaseSchedule


class ScriptedObserver(CaseSchedule):
    """The schedule over a `call` that only notes what it was asked and takes `took` s."""

    def __init__(self, settings: Settings, took: float = 1e-3, wrong_at: int | None = None,
                 timed: bool = True) -> None:
        self.world, self.op, self.s = 2, checks.get("allreduce"), settings
        self.rng = np.random.default_rng(3)
        self.staged, self.timed, self.trials, self.batch = False, timed, True, False
        self.batches: dict[str, int] = {}
        self.ranks = [SimpleNamespace(placed=["old"], feed_bytes=1 << 20) for _ in range(2)]
        self.where, self.case_no = "", 0
        self.took, self.wrong_at = took, wrong_at
        self.made: list[tuple[bool, bool]] = []  # (check, own_completion) per call

    def call(self, case, trial, check, own_completion=False, holds=None, scrub=False):
        self.made.append((check, own_completion))
        if len(self.made) == self.wrong_at:
            raise WrongAnswer(["bad"])
        return Timing(self.took)


def settings(**kw) -> Settings:
    base = dict(reps=3, max_reps=5, timing_budget=1.0, warmup=2, wall_s=60.0, rtol=0.0,
                atol=0.0)
    return Settings(**{**base, **kw})


def case(trials: int = 2):
    return checks.get("allreduce").make_case(np.random.default_rng(1), "c0", 16, "float32", 2,
                                             {}, trials, 0)


def test_a_case_runs_its_trials_then_warm_up_then_timed_repetitions():
    obs = ScriptedObserver(settings(max_reps=4, timing_budget=1.0))
    times = obs.run_case(case(trials=2))
    assert obs.made[:2] == [(True, True)] * 2  # the trials, each taken at own completion
    timed = [m for m in obs.made[2:] if m[0]]
    assert len(times) == len(timed) == 4  # up to max_reps: the budget is far from spent
    assert all(not m[0] for m in obs.made[2:-4])  # the warm-up is not checked
    assert obs.case_no == 1 and obs.where.startswith("case c0 (count=16 float32)")
    assert all(r.placed == [] for r in obs.ranks)


def test_timed_repetitions_stop_once_the_budget_is_spent():
    obs = ScriptedObserver(settings(reps=2, max_reps=50, timing_budget=2.5e-3))
    assert len(obs.run_case(case())) == 3


def test_a_wrong_answer_is_labelled_by_the_case_and_the_call_it_came_from():
    obs = ScriptedObserver(settings(), wrong_at=2)
    with pytest.raises(WrongAnswer) as caught:
        obs.run_case(case(trials=2))
    assert caught.value.errors == ["[count=16 float32, trial 1] bad"]


def test_an_untimed_job_makes_a_few_checked_calls_after_the_trials():
    obs = ScriptedObserver(settings(reps=5), timed=False)
    assert obs.run_case(case(trials=1)) == []
    assert obs.made == [(True, True)] + [(True, False)] * 3


def test_the_wall_clock_stops_repetitions_after_the_fewest_allowed():
    obs = ScriptedObserver(settings(reps=10, max_reps=10, wall_s=0.0))
    assert obs._enough(MIN_REPS - 1, 0.0, 1.0) is False
    assert obs._enough(MIN_REPS, 0.0, 1.0) is True


def test_a_call_s_timing_is_per_call_of_its_batch():
    trial = case(trials=1).trials[0]
    c = Call(1, [trial] * 4, check=False, own=False, world=2, order=[0, 1], late=set())
    c.gate, c.done, c.before, c.after = [1.0, 2.0], [3.0, 6.0], 0.4, 0.8
    assert c.timing() == Timing(1.0, 0.1, 0.2)
    assert c.left == {0, 1} and c.taken == [None, None]


def test_a_rank_s_lines_are_read_whole_and_what_is_not_a_message_is_passed_over():
    ours, theirs = socket.socketpair()
    rank = observer_wire.Rank(ours, 1)
    try:
        theirs.sendall(b'{"phase": "loading"}\nnot json\n' + b"x" * 2000 + b'\n{"raised"')
        read, messages = rank.read()
        assert read > 2000 and messages == [{"phase": "loading"}]
        theirs.sendall(b": true}\n")
        assert rank.read()[1] == [{"raised": True}]
    finally:
        rank.close()
        theirs.close()


@pytest.mark.parametrize("hello, expected", [
    ({"rank": 2, "host": "node-a"}, (2, "node-a")),
    ({"rank": "1", "host": "bad\nhost"}, (1, None)),
    ({"rank": 0, "host": "h" * 256}, (0, None)),
    ({"host": "node-a"}, None),
])
def test_a_hello_names_its_rank_and_a_printable_host(hello, expected):
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(json.dumps(hello).encode() + b"\n")
        assert observer_wire.read_hello(ours) == expected
    finally:
        ours.close()
        theirs.close()


def test_messages_of_a_held_back_call_say_which_rank_and_how_long():
    trial = SimpleNamespace(delays=[0.0, 2e-3, 0.0])
    assert observer_checks.held_back(["wrong"], trial, None, 3) == [
        "wrong (rank 1 held back 2 ms; every rank's outputs as they were when its own call "
        "completed)"]
    trial = SimpleNamespace(delays=[0.0, 0.0])
    assert observer_checks.held_back(["wrong"], trial, [(0, 0.0125, "device")], 2) == [
        "wrong (rank 0's stream held back 12.5 ms on its device; every rank's outputs as they "
        "were when its own call completed)"]


def test_what_other_modules_import_from_the_observer_is_still_there():
    assert set(observer.__all__) <= set(vars(observer))
    assert observer.Timing is observer_phases.Timing
    assert observer.charged is observer_phases.charged
    assert observer.WrongAnswer is observer_checks.WrongAnswer
    assert observer.guard_reports is observer_wire.guard_reports
    assert observer.RAISED_GRACE_S == 10.0
