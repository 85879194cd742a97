"""The session's parts, each in a module named for its job, and the names they keep importable
from `pytest_commbench.session`; the ThunderKittens folder handed to the platform, never
written into the controller's environment; the job runner's judging of how a job ended."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_commbench import makers, options, session
from pytest_commbench.engine import job
from pytest_commbench.launch import JobResult
from pytest_commbench.platforms.gpu import software_features
from pytest_commbench.tasks import load_task
from pytest_commbench.toolchains import nvidia
from pytest_commbench.verdicts import Verdict

REPO = Path(__file__).resolve().parent.parent.parent

#: every name other modules and tests imported from the session before it was split
SESSION_NAMES = (
    "AGENT_NAMES", "ALIASES", "DEFAULTS", "FLAGS", "GROUPS", "OPTIONS", "PARSERS", "RUN_FILE",
    "STATE", "CommbenchState", "KnownNames", "Option", "create", "flag_name", "given",
    "group_of", "labelled", "lookup", "renamed", "setting",
)


class Config:
    """What the option lookup asks of a pytest config: command-line values, no ini file."""

    inipath = None

    def __init__(self, **given: object) -> None:
        self.given = given

    def getoption(self, name: str, default: object = None) -> object:
        return self.given.get(name.removeprefix("commbench_"), default)

    def getini(self, name: str) -> str:
        return ""


def test_the_session_keeps_every_name_importable():
    missing = [name for name in SESSION_NAMES if not hasattr(session, name)]
    assert not missing, missing
    assert session.OPTIONS is options.OPTIONS and session.AGENT_NAMES is makers.AGENT_NAMES


def test_the_option_table_parses_each_value_by_its_kind():
    assert options.PARSERS["seed"]("0x10") == 16 and options.PARSERS["reps"]("12") == 12
    assert options.PARSERS["check_only"]("yes") is True
    with pytest.raises(pytest.UsageError, match="expected one of auto, off"):
        options.PARSERS["sanitizer"]("valgrind")
    with pytest.raises(pytest.UsageError, match="--commbench-samples: expected a whole number"):
        options.labelled("samples")("0")


@pytest.fixture
def kittens(tmp_path, monkeypatch) -> Path:
    """A ThunderKittens repository (headers under include/); the variable unset."""
    monkeypatch.delenv(nvidia.THUNDERKITTENS_ENV, raising=False)
    (tmp_path / "tk" / "include").mkdir(parents=True)
    (tmp_path / "tk" / "include" / "kittens.cuh").write_text("// kittens\n")
    return tmp_path / "tk"


def test_the_thunderkittens_folder_goes_to_the_platform_not_the_environment(kittens):
    platform = SimpleNamespace(thunderkittens=None)
    makers._find_thunderkittens(Config(thunderkittens=str(kittens)), platform)
    assert platform.thunderkittens == kittens.resolve()
    assert nvidia.THUNDERKITTENS_ENV not in os.environ
    assert "thunderkittens" in software_features(platform.thunderkittens)
    assert "thunderkittens" not in software_features()
    task = load_task(REPO / "suites" / "collective" / "tk_allreduce" / "task.toml",
                     REPO / "suites")
    argv = nvidia.cuda_command(task, Path("s.cu"), Path("s.so"), "sm_90",
                               thunderkittens=platform.thunderkittens)
    assert str(kittens.resolve() / "include") in argv and "-std=c++20" in argv


def test_a_thunderkittens_folder_without_headers_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv(nvidia.THUNDERKITTENS_ENV, raising=False)
    platform = SimpleNamespace(thunderkittens=None)
    with pytest.raises(pytest.UsageError, match="no ThunderKittens headers"):
        makers._find_thunderkittens(Config(thunderkittens=str(tmp_path)), platform)


def test_without_the_option_the_headers_are_where_the_environment_says(kittens, monkeypatch):
    monkeypatch.setenv(nvidia.THUNDERKITTENS_ENV, str(kittens))
    assert nvidia.thunderkittens_include() == (kittens / "include").resolve()
    platform = SimpleNamespace(thunderkittens=None)
    makers._find_thunderkittens(Config(), platform)  # the option read from the variable
    assert platform.thunderkittens == kittens.resolve()


def _result(timed_out: bool) -> JobResult:
    return JobResult(returncode=-9, output="", seconds=1.0, timed_out=timed_out)


def test_an_observer_failure_before_the_solution_loads_is_raised():
    outcome = job.Outcome(Verdict.PASS)
    with pytest.raises(KeyError):
        job._judge_ending(outcome, KeyError("x"), False, _result(False), 5.0, None)
    job._judge_ending(outcome, KeyError("x"), True, _result(False), 5.0, None)
    assert outcome.verdict is Verdict.RUNTIME_ERROR
    assert outcome.message.startswith("the job made the observer fail (KeyError")


def test_an_infrastructure_end_after_the_solution_loads_is_the_solutions():
    outcome = job.Outcome(Verdict.INFRA_ERROR)
    job._judge_ending(outcome, None, True, _result(True), 5.0, None)
    assert outcome.verdict is Verdict.TIMEOUT
    assert outcome.message == "the job did not finish within 5 s and was killed"
    misplaced = job.Outcome(Verdict.INFRA_ERROR)
    job._judge_ending(misplaced, None, True, _result(False), 5.0, "rank 1 landed on b")
    assert misplaced.verdict is Verdict.INFRA_ERROR
