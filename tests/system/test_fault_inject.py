"""tools/fault-inject's session scenarios as tests: a pytest worker killed from outside mid-item,
and the session itself interrupted with Ctrl-C, each then resumed — the same verdicts and costs
as an uninterrupted run, and the kept answer never asked for again; records that lie in a
finished run's log. (The tool runs every scenario; these are the ones no other test makes
with a real signal.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import signal
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fault-inject"


@pytest.fixture(scope="module")
def tool():
    pytest.importorskip("openai")
    pytest.importorskip("xdist")
    loader = importlib.machinery.SourceFileLoader("fault_inject", str(TOOL))
    spec = importlib.util.spec_from_loader("fault_inject", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, target, signum", [
    ("worker_sigkill_then_resume", "worker", signal.SIGKILL),
    ("session_sigint_then_resume", "session", signal.SIGINT),
])
def test_an_interrupted_run_resumes_to_the_uninterrupted_verdicts_and_costs(tool, tmp_path, name,
                                                                             target, signum):
    row = tool.interrupted(name, target, signum, tmp_path)
    assert row["ok"], row
    assert (row["faulty"], row["healthy"]) == ("pass", "pass")
    assert "the answer asked 1 time" in row["message"]


def test_records_that_lie_leave_the_report_and_a_resume_going(tool, tmp_path):
    row = tool.records_that_lie("records_that_lie", tmp_path)
    assert row["ok"], row
    assert f"{len(tool.BAD_LINES)}/{len(tool.BAD_LINES)} bad lines named" in row["message"]


def test_every_scenario_name_is_known_and_unique(tool):
    names = [*tool.SCENARIOS, *tool.ENDPOINTS, *tool.MANIFESTS, *tool.SESSIONS]
    assert len(names) == len(set(names)) >= 30
    assert set(tool.EXPECT) <= set(tool.SCENARIOS)
