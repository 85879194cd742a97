"""The statement before the first item of whether this machine can time the selected items
(and the warning where -n makes timed items share too few CPUs): the decision with injected CPU
counts and loads, and the line a session writes before its items. No timing is asserted."""

from __future__ import annotations

import pytest

from pytest_commbench.capacity import fits, outlook
from pytest_commbench.timing import HostLoad

TASK = "collective/ring_allreduce"


@pytest.mark.parametrize("ranks, at_once, cpus, load, ok", [
    (2, 1, 2, 0.0, False),  # two spinning ranks and the observer on 2 CPUs
    (1, 1, 2, 0.0, True),
    (2, 1, 3, 0.0, True),
    (2, 1, 3, 0.5, False),  # other load takes half a CPU
    (2, 2, 6, 0.0, True),
    (2, 3, 6, 0.0, False),  # -n 3: nine CPUs wanted
    (4, 1, 4, 0.0, False),
])
def test_the_rule_is_the_harness_contention_rule(monkeypatch, ranks, at_once, cpus, load, ok):
    """`fits` says contended exactly where HostLoad, timing the item, would say so."""
    monkeypatch.setattr("pytest_commbench.timing._cpus_busy", lambda _cpus: 0.0)
    monkeypatch.setattr("pytest_commbench.timing._own_cpu", lambda: 0.0)
    host = HostLoad()
    host.cpus = set(range(cpus))
    host.start()
    measured = host.stop(ranks)  # no outside load measured: add ours to the ranks' demand
    demand = at_once * (ranks + 1) + load
    assert fits(ranks, at_once, cpus, load) is ok
    assert (demand > cpus + 0.25) is (not ok)
    if at_once == 1 and load == 0:
        assert measured["contended"] is (not ok)


def test_none_timeable_says_so_what_it_reports_and_what_to_run_instead():
    said = outlook([4, 4, 2], workers=1, cpus=2, load=0.0)
    assert "cannot time any of the 3 timed items (2 CPUs, load 0.0" in said.line
    assert "reported as contended, not to be read" in said.line
    assert "pass rates are measured as usual" in said.line
    assert "--commbench-check-only" in said.line and "5 CPUs or more" in said.line
    assert said.warning is None and "\n" not in said.line


def test_some_timeable_names_which_and_all_timeable_says_intervals():
    some = outlook([1, 1, 4], workers=1, cpus=4, load=0.0)
    assert "can time 2 of the 3 timed items" in some.line and "more than 1 ranks" in some.line
    every = outlook([2, 2], workers=1, cpus=8, load=1.0)
    assert "can time all 2 timed items" in every.line and "90% intervals" in every.line
    assert every.warning is None


def test_more_workers_than_the_cpus_hold_is_warned_about():
    said = outlook([2, 2, 2, 2], workers=4, cpus=6, load=0.0)
    assert "can time all 4" in said.line  # each alone fits
    assert said.warning.startswith("commbench: warning: -n 4 times 4 items at once on 6 CPUs")
    assert "-n 2 or fewer times them readably" in said.warning
    assert outlook([2, 2], workers=2, cpus=6, load=0.0).warning is None
    one = outlook([2, 2], workers=2, cpus=4, load=0.0)
    assert "without -n they are timed readably" in one.warning


def test_check_only_and_compile_only_say_what_is_measured():
    said = outlook([4], workers=1, cpus=2, load=0.0, check_only=True)
    assert "correctness only" in said.line and "nothing is timed" in said.line
    assert said.warning is None
    assert "none runs" in outlook([4], 1, 2, 0.0, compile_only=True).line
    assert outlook([], workers=1, cpus=2, load=0.0) is None


# -- the session's line -----------------------------------------------------------------------

CONFTEST = """
import pytest_commbench.capacity as capacity
capacity.machine = lambda: ({cpus}, 0.0)
"""


def _timed(bench, cpus: int) -> None:
    ini = bench.root / "pytest.ini"
    ini.write_text(ini.read_text().replace("commbench_check_only = true\n", ""))
    (bench.root / "conftest.py").write_text(CONFTEST.format(cpus=cpus))


def test_a_session_says_before_its_items_that_it_cannot_time_them(bench):
    bench.add_task(TASK, ranks=2)
    _timed(bench, cpus=2)
    result = bench.run("--commbench-model=template")
    lines = result.stdout.lines
    (said,) = [i for i, x in enumerate(lines) if x.startswith("commbench: timing:")]
    assert "cannot time any of the 1 timed items (2 CPUs, load 0.0" in lines[said]
    first_item = next(i for i, x in enumerate(lines) if "task.toml" in x and "%]" in x)
    assert said < first_item


def test_a_session_with_n_workers_warns_that_they_share_too_few_cpus(bench):
    pytest.importorskip("xdist")
    bench.add_task(TASK, ranks=2)
    bench.add_task(TASK, ranks=2, name="ring_allreduce_b")
    _timed(bench, cpus=4)
    result = bench.run("--commbench-model=template", "-n", "2")
    out = result.stdout.str()
    assert "commbench: timing: this machine can time all 2 timed items (4 CPUs" in out
    assert "commbench: warning: -n 2 times 2 items at once on 4 CPUs" in out
    assert out.index("commbench: warning: -n 2") < out.index("commbench: model template")
