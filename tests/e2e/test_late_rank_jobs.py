"""The held rank of the late trials, and each rank's outputs taken at its own completion.

- Which rank a late trial holds back is no luck: every rank is held at least once per item
  (world 2, 4, 8, every task of the suite), tasks with `late_rank = false` get no late trial.
- In a trial that holds a rank back, a rank's outputs are those it had when its own call
  completed (staged backends: fetched the moment it says it is done, not once every rank
  is): driven here through `Observer.call` with rank threads speaking the control-page
  protocol (the real rank loop, `Calls`, over a staged backend in host memory), a rank that
  returns at once while a peer writes its outputs later is a wrong answer; an honest
  solution passes, and the same cheat passes where outputs are taken once every rank is
  done (what the test tells apart).
"""

from __future__ import annotations

import json

import pytest

CONFTEST = '''
import json, os
from pytest_commbench import observer

_run_case = observer.Observer.run_case

def run_case(self, case):
    with open(os.environ["LATE_LOG"], "a") as f:
        f.write(json.dumps([case.id, [list(t.delays) for t in case.trials]]) + "\\n")
    return _run_case(self, case)

observer.Observer.run_case = run_case
'''


@pytest.mark.parametrize("late_rank", [True, False])
def test_the_runner_holds_every_rank_or_none_where_the_task_says_so(bench, late_rank,
                                                                     monkeypatch):
    """The whole pipeline on the CPU (4 ranks, 2 sizes: fewer cases than ranks): the cases
    the observer runs hold every rank once at least, or, with `late_rank = false`, none."""
    task = bench.add_task(ranks=4, sizes=[1, 3])
    if not late_rank:
        manifest = task / "task.toml"
        manifest.write_text(manifest.read_text().replace("[check]\n", "[check]\nlate_rank = false\n"))
    log = bench.root / "late.jsonl"
    (bench.root / "conftest.py").write_text(CONFTEST)
    monkeypatch.setenv("LATE_LOG", str(log))
    result = bench.run("--commbench-model=reference")
    result.assert_outcomes(passed=1)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert [cid for cid, _ in seen] == ["c0", "c1"]
    held = [[r for r, d in enumerate(delays) if d > 0] for _, trials in seen for delays in trials]
    if late_rank:
        assert held == [[], [0], [1], [2], [3], [], [1]]
    else:
        assert held == [[]] * 4
