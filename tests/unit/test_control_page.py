"""A completion the harness did not see is no completion: the words a rank's harness answers
the observer with ("ready", "took", "done", "saved") are written only by that harness, and only
once the observer asked for that step. The rank's process can write any word of its control page
(a native solution finds the page in its own address space), so both sides check:

- the observer, before it asks a rank for step k, that the rank's answer word is below k
  (a thread of the solution that writes "done" = k + 1 as soon as the harness wrote k makes
  every later call "done" the moment its gate opens, its work moved out of the timed
  interval: measured at 15x on the H200 before this check);
- the harness, before it writes its answer k, that the word is below k (a thread that
  writes "done" the moment the gate opens, before the harness could).

Either way the rank's solution is `forbidden`. Driven here through the observer with rank
threads running the real rank loop (tests/unit/test_late_rank.py), the forging thread writing
the page through the observer's own mapping of it (the same memory file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_late_rank import ranks_in_threads

from pytest_commbench import checks
from pytest_commbench.observer import JobEnded, Observer, Settings
from pytest_commbench.rank import harness
from pytest_commbench.rank.protocol import GUARD_EXIT, PAGE, Control
from pytest_commbench.verdicts import Verdict


def _observe(tmp_path: Path, staged: bool, forge: str | None) -> JobEnded | None:
    """Three gated calls of an all-reduce case on two rank threads; `forge`: once the first
    call is over (its harness said done 1), rank 1's word of that name ("done", "took") is
    set to 2, as a thread of its solution would. Returns how the job ended (None: every call
    went through)."""
    world = 2
    op = checks.get("allreduce")
    case = op.make_case(np.random.default_rng(3), "c0", 64, "float32", world, {}, 3, 0)
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=1e-6, atol=1e-6)
    job_dir = tmp_path / f"job-{staged}-{forge}"
    job_dir.mkdir()
    obs = Observer(job_dir, world, op, settings, np.random.default_rng(4), staged=staged,
                   timed=False)

    def solution_for(rank: int):
        def solution(ctx, sendbuf, recvbuf):
            recvbuf[...] = sendbuf  # unchecked calls (check=False): any outputs do
        return solution

    ended = None
    with ranks_in_threads(obs, job_dir, case, staged, solution_for):
        obs.case_no += 1
        try:
            for n, trial in enumerate(case.trials):
                if forge and n == 1:
                    assert obs.ranks[1].ctl.get(forge) == 1
                    obs.ranks[1].ctl.set(forge, 2)
                obs.call(case, trial, check=False)
        except JobEnded as exc:
            ended = exc
    return ended


@pytest.mark.parametrize("word", ["done", "took"])
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_a_done_word_written_ahead_of_the_gate_is_forbidden(tmp_path, staged, word):
    ended = _observe(tmp_path, staged, word)
    assert ended is not None and ended.verdict is Verdict.FORBIDDEN, ended
    assert f"rank 1's control page said {word!r} = 2 before the observer asked for gate 2" \
        in ended.message, ended.message


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_an_honest_rank_answers_every_step_in_turn(tmp_path, staged):
    assert _observe(tmp_path, staged, None) is None


def test_the_harness_refuses_a_word_someone_else_wrote_first(tmp_path, monkeypatch):
    """A thread that writes "done" the moment the gate opens beats the observer's check;
    the harness's own write finds it there: the guards' report and exit code."""
    fd = os.memfd_create("ctl")
    os.ftruncate(fd, PAGE)
    ctl = Control(fd)
    ended: list[tuple] = []

    def exit_(code):
        ended.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(harness.os, "_exit", exit_)
    calls = harness.Calls.__new__(harness.Calls)
    calls.ctl, calls.report = ctl, str(tmp_path / "guard_r1.json")
    calls.say("done", 1)  # its own answer to step 1
    assert ctl.get("done") == 1 and not ended
    ctl.set("done", 2)  # the solution's, before the harness's own
    with pytest.raises(SystemExit):
        calls.say("done", 2)
    assert ended == [GUARD_EXIT]
    report = json.loads((tmp_path / "guard_r1.json").read_text())
    assert report["forbidden"] == "the control page"
    assert "'done' word was 2 before its harness said done for call 2" in report["detail"]
    os.close(fd)
