"""The late trials in a real item: the runner holds every rank, or none where the task says
so (`late_rank = false`); what a held rank does is tests/unit/test_late_rank.py's."""

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
