"""The engine's timing policy and verdict mapping, driven by a fake job runner: no rank is
launched, so ABBA order, the check and warm-up jobs, adaptive stopping, the contended stop
and who is blamed for a failing job are tests of milliseconds."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_commbench.engine import InfraError, ItemResult, Outcome, Plan, Settings, evaluate
from pytest_commbench.engine.measure import figures, measure, trust
from pytest_commbench.engine.refinement import feedback
from pytest_commbench.engine.result import Usage, first_pass
from pytest_commbench.observer import Timing
from pytest_commbench.record import MachineLoad
from pytest_commbench.verdicts import Rejected, Verdict

CASES = ("c0", "c1")


@dataclass
class FakeJobs:
    """A job runner that records each job it is asked for and times every call of it as
    `times(role, job number of that role)` says (seconds); `fail` makes a given job fail."""

    ref: Path
    sol: Path
    times: object = None
    fail: dict = field(default_factory=dict)  # job folder name -> Outcome
    ran: list = field(default_factory=list)  # (folder name, timed, trials)
    sanitized: list = field(default_factory=list)  # (tool, counts, deadline) per checker job

    def __call__(self, plan, artifact, job_dir, timed, trials=True, sanitize=None):
        name = job_dir.name
        self.ran.append((name, timed, trials))
        if sanitize:
            self.sanitized.append((sanitize, [c.count for c in plan.cases], plan.deadline))
        if name in self.fail:
            return self.fail[name]
        role = "ref" if artifact == self.ref else "sol"
        count = sum(1 for n, *_ in self.ran if n.startswith(role) or
                    (role == "ref" and n == "warmup"))
        t = self.times(role, count) if self.times else 1e-3
        calls = [Timing(t * (1 + 0.001 * i)) for i in range(5)]
        return Outcome(Verdict.PASS, times={c: list(calls) for c in CASES},
                       output=f"{role} job {name}", batches={"c0": 4},
                       phases_s=(float(len(self.ran)), 0.5, 0.1))


class Load:
    """HostLoad's stand-in: contended or not, as told."""

    def __init__(self, contended=False):
        self.contended, self.stops = contended, 0

    def start(self):
        pass

    def stop(self, busy):
        self.stops += 1
        return {"contended": self.contended, "busy": busy}


def _plan(tmp_path, language="python", checker=None, counts=(1024, 2048), **options) -> Plan:
    settings = Settings(seed=1, work=tmp_path, cache=tmp_path, references=tmp_path, **options)
    cases = [SimpleNamespace(id=c, count=n, dtype="float32", world=2, params={})
             for c, n in zip(CASES, counts)]
    op = SimpleNamespace(bytes=lambda count, dtype, world, params: (count * 4, 1.0))
    task = SimpleNamespace(metric=SimpleNamespace(name="time", unit="us", bytes="algbw"),
                           language=language)
    platform = SimpleNamespace(backend="cpu", name="fake", staged=False,
                               sanitizer=lambda tool, out: checker and (checker, tool))
    return Plan(task, 2, platform, settings, op, cases, 10.0)


def _jobs(tmp_path, **kw) -> FakeJobs:
    return FakeJobs(tmp_path / "ref.so", tmp_path / "sol.so", **kw)


def test_the_solution_is_checked_first_then_a_warm_up_then_abba(tmp_path):
    jobs = _jobs(tmp_path)
    plan = _plan(tmp_path, timing_rounds=4, timing_max_rounds=4)
    got = measure(plan, {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    assert [n for n, *_ in jobs.ran] == ["check", "warmup", "ref0", "sol0", "sol1", "ref1",
                                         "ref2", "sol2", "sol3", "ref3"]
    # the check job is untimed, with the trials; the reference's jobs never run the trials
    assert jobs.ran[0] == ("check", False, True) and jobs.ran[1] == ("warmup", True, False)
    assert all(trials == name.startswith("sol") for name, _, trials in jobs.ran[2:])
    # the warm-up's times are thrown away: four jobs per role, none of them the warm-up's
    assert got.rounds == 4 and all(len(got.times[r]["c0"]) == 4 for r in ("ref", "sol"))
    # the warm-up chose the batches every later job runs with
    assert plan.batches == {"c0": 4} and got.output == "sol job sol3"
    # where each job's time went, every job of the item in the order they ran
    assert list(got.job_phases_s) == [n for n, *_ in jobs.ran]
    assert [p[0] for p in got.job_phases_s.values()] == [float(i) for i in range(1, 11)]


def test_a_check_only_item_runs_the_solution_once_untimed(tmp_path):
    jobs = _jobs(tmp_path)
    got = measure(_plan(tmp_path), {"sol": jobs.sol}, jobs, lambda: Load())
    assert jobs.ran == [("sol0", False, True)] and got.rounds == 0 and got.host_load is None


def test_a_compiled_answer_runs_its_smallest_sizes_under_the_memory_checker(tmp_path):
    jobs = _jobs(tmp_path)
    plan = _plan(tmp_path, "cuda", "compute-sanitizer", counts=(4096, 1), sanitizer="auto")
    measure(plan, {"sol": jobs.sol}, jobs, lambda: Load())
    # auto: memcheck, after the check, at the two smallest sizes, with a longer deadline
    assert [n for n, *_ in jobs.ran] == ["sol0", "sanitize"]
    assert jobs.sanitized == [("memcheck", [4096, 1], 30.0)]
    # timed: right after the check job, before any reference job is spent
    jobs = _jobs(tmp_path)
    plan = _plan(tmp_path, "cuda", "compute-sanitizer", sanitizer="racecheck",
                 timing_rounds=1, timing_max_rounds=1)
    measure(plan, {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    assert [n for n, *_ in jobs.ran][:3] == ["check", "sanitize", "warmup"]
    assert jobs.sanitized[0][0] == "racecheck"


def test_a_finding_of_the_memory_checker_rejects_the_answer(tmp_path):
    found = Outcome(Verdict.WRONG_ANSWER, "compute-sanitizer memcheck found 1 error(s) on "
                    "rank 0: Invalid __global__ write of size 4 bytes")
    jobs = _jobs(tmp_path, fail={"sanitize": found})
    with pytest.raises(Rejected) as exc:
        measure(_plan(tmp_path, "cuda", "cs", sanitizer="memcheck"), {"sol": jobs.sol}, jobs,
                lambda: Load())
    assert exc.value.verdict is Verdict.WRONG_ANSWER and "Invalid __global__" in exc.value.message


def test_no_checker_job_for_python_answers_where_there_is_none_or_when_off(tmp_path):
    for plan in (_plan(tmp_path, "python", "cs", sanitizer="auto"),
                 _plan(tmp_path, "cuda", None, sanitizer="auto"),
                 _plan(tmp_path, "cuda", "cs")):  # off by default
        jobs = _jobs(tmp_path)
        measure(plan, {"sol": jobs.sol}, jobs, lambda: Load())
        assert jobs.sanitized == [] and [n for n, *_ in jobs.ran] == ["sol0"]
    # a tool asked for by name where the platform has no checker: the harness's failure
    jobs = _jobs(tmp_path)
    with pytest.raises(InfraError, match="no memory checker"):
        measure(_plan(tmp_path, "cuda", None, sanitizer="memcheck"), {"sol": jobs.sol}, jobs,
                lambda: Load())


def _noisy(role, n):
    """Reference jobs alternate between 1 ms and 3 ms: the speedup stays imprecise."""
    return 1e-3 if role == "sol" else (1e-3 if n % 2 else 3e-3)


def test_rounds_are_added_while_the_speedup_is_imprecise_up_to_the_maximum(tmp_path):
    jobs = _jobs(tmp_path, times=_noisy)
    got = measure(_plan(tmp_path, timing_rounds=2, timing_max_rounds=5),
                  {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    assert got.rounds == 5 and got.imprecise and got.speedup_se > 0.03


def test_no_round_is_added_once_the_speedup_is_precise(tmp_path):
    jobs = _jobs(tmp_path, times=lambda role, n: 1e-3 if role == "sol" else 2e-3)
    got = measure(_plan(tmp_path, timing_rounds=2, timing_max_rounds=6),
                  {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    assert got.rounds == 2 and not got.imprecise and got.stopped is None


def test_a_contended_host_gets_no_rounds_past_the_minimum_unless_asked(tmp_path):
    load = Load(contended=True)
    jobs = _jobs(tmp_path, times=_noisy)
    got = measure(_plan(tmp_path, timing_rounds=2, timing_max_rounds=6),
                  {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: load)
    assert got.rounds == 2 and got.stopped == "contended" and got.imprecise
    jobs = _jobs(tmp_path, times=_noisy)
    got = measure(_plan(tmp_path, timing_rounds=2, timing_max_rounds=4,
                        timing_contended="continue"),
                  {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load(contended=True))
    assert got.rounds == 4 and got.stopped is None


def test_a_failing_solution_is_rejected_at_its_first_failing_job(tmp_path):
    wrong = Outcome(Verdict.WRONG_ANSWER, "c1: 3 of 8 elements differ", "first at 5",
                    output="x" * 5000)
    jobs = _jobs(tmp_path, fail={"sol1": wrong})
    with pytest.raises(Rejected) as caught:
        measure(_plan(tmp_path, timing_rounds=3), {"ref": jobs.ref, "sol": jobs.sol}, jobs,
                lambda: Load())
    assert caught.value.verdict is Verdict.WRONG_ANSWER and len(caught.value.output) == 4000
    assert [n for n, *_ in jobs.ran][-1] == "sol1"  # nothing run after it
    jobs = _jobs(tmp_path, fail={"check": wrong})
    with pytest.raises(Rejected):
        measure(_plan(tmp_path), {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    assert [n for n, *_ in jobs.ran] == ["check"]  # no reference job spent on a wrong answer


@pytest.mark.parametrize("job", ["warmup", "ref0", "ref1"])
def test_a_failing_reference_is_the_harness_s_failure(tmp_path, job):
    hung = Outcome(Verdict.TIMEOUT, "the job did not finish within 10 s", "rank 1: stuck")
    jobs = _jobs(tmp_path, fail={job: hung})
    with pytest.raises(InfraError, match=r"the reference failed \(timeout\).*\n.*rank 1: stuck"):
        measure(_plan(tmp_path), {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())


def test_figures_and_trust_of_a_measured_item(tmp_path):
    jobs = _jobs(tmp_path, times=lambda role, n: 1e-3 if role == "sol" else 2e-3)
    plan = _plan(tmp_path, timing_rounds=3, timing_max_rounds=3)
    got = measure(plan, {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    sizes, value = figures(plan, got)
    assert value == pytest.approx(2.0, rel=1e-6)
    assert [s.batch for s in sizes] == [4, 1] and len(sizes[0].jobs_sol_us) == 3
    ci90, level = trust(sizes, value, got, shared=False)
    assert level == "ok" and ci90[0] <= value <= ci90[1]
    assert trust(sizes, value, got, shared=True)[1] == "shared"
    got.host_load = MachineLoad(contended=True)
    assert trust(sizes, value, got, shared=False)[1] == "contended"


def _task(tmp_path):
    (tmp_path / "template.py").write_text("# commbench: begin\npass\n# commbench: end\n")
    return SimpleNamespace(template=tmp_path / "template.py", suffix=".py", relpath="t/x")


def test_evaluate_never_raises_and_blames_the_model_source_for_its_outage(tmp_path):
    from pytest_commbench.models.base import Candidate

    def broken():
        raise ConnectionError("503 from the provider")

    settings = Settings(seed=1, work=tmp_path / "w", cache=tmp_path, references=tmp_path)
    result = evaluate(_task(tmp_path), 2, Candidate("", "solution", broken), None, settings,
                      _jobs(tmp_path))
    assert isinstance(result, ItemResult) and result.verdict == "infra_error"
    assert "the model source failed: ConnectionError: 503" in result.message
    assert not (tmp_path / "w").exists()  # tidied


def test_evaluate_takes_the_answer_as_a_value(tmp_path):
    """A reply is judged as it is, with no candidate around it: a cut one is `truncated` and
    never built or run; an outage the source reported is the provider's `infra_error`."""
    from pytest_commbench.engine import produce
    from pytest_commbench.models.base import Reply

    settings = Settings(seed=1, work=tmp_path / "w", cache=tmp_path, references=tmp_path)
    jobs = _jobs(tmp_path)
    cut = evaluate(_task(tmp_path), 2, Reply("x", truncated=True, tokens_out=9), None,
                   settings, jobs, kind="mutant")
    assert cut.verdict == "truncated" and "9 tokens" in cut.message
    assert jobs.ran == []  # nothing built or run

    def broken():
        raise TimeoutError("no answer")

    outage = produce(broken)
    assert outage.infra_error == "TimeoutError: no answer"
    result = evaluate(_task(tmp_path), 2, outage, None, settings, jobs)
    assert result.verdict == "infra_error" and "TimeoutError: no answer" in result.message


def test_the_record_is_written_once_and_read_back_by_any_version():
    result = ItemResult("pass", speedup=1.5, sizes=[{"count": 1, "speedup": 1.5}],
                        timing_trust="ok", reply_text="secret code", imprecise=False)
    record = result.as_record()
    assert "reply_text" not in record and "imprecise" not in record
    assert "timing_stopped" not in record and record["timing_trust"] == "ok"
    again = ItemResult.from_record({**record, "a_field_of_a_later_version": 1})
    assert again.as_record() == record
    assert "1.50x" in feedback(again) and "secret" not in feedback(again)
    wrong = ItemResult("wrong_answer", message="c0 differs", output="rank 0 printed this")
    assert "c0 differs" in feedback(wrong) and "rank 0 printed this" in feedback(wrong)


def test_a_strategy_s_parts_are_written_flat_and_read_back():
    plain = ItemResult("pass").as_record()
    assert "round" not in plain and "round_history" not in plain and "agent" not in plain
    history = [{"round": 1, "verdict": "wrong_answer"}, {"round": 2, "verdict": "pass"}]
    refined = ItemResult("pass", rounds=2, round_history=history, round=2)
    record = refined.as_record()
    assert record["round"] == 2 and record["round_history"] == history
    summary = {"agent": "geak", "agent_calls": {"generate": 2}, "agent_stop": "rounds"}
    agent = replace(refined, agent=summary).as_record()
    assert {k: agent[k] for k in summary} == summary
    for written in (record, agent):
        assert ItemResult.from_record(written).as_record() == written
    # a refinement that never passed still says so (round None, with its history)
    failed = ItemResult("wrong_answer", round_history=history[:1]).as_record()
    assert failed["round"] is None and ItemResult.from_record(failed).as_record() == failed


def test_usage_counts_each_answer_once_and_spends_what_each_cost_when_asked():
    usage = Usage()
    usage.add(10, 5, 0.25, [{"cost": 0.25, "replayed": False}])
    # a kept answer another item of this run already counted: no tokens, no cost, but the
    # budget still spends what it cost when it was asked
    usage.add(0, 0, 0.0, [{"cost": 0.5, "replayed": True}], replayed=True)
    usage.add(1, 1, 0.125, [])  # a source without a request record: its own cost
    assert (usage.tokens_in, usage.tokens_out, usage.cost) == (11, 6, 0.375)
    assert usage.spent == 0.875 and usage.replayed and len(usage.requests) == 2
    assert first_pass([{"round": 1, "verdict": "timeout"}, {"round": 2, "verdict": "pass"}]) == 2
    assert first_pass([{"round": 1, "verdict": "timeout"}]) is None


def test_run_settings_defaults_are_the_option_table_s():
    from dataclasses import fields

    from pytest_commbench.engine import RunSettings
    from pytest_commbench.session import DEFAULTS

    for f in fields(RunSettings):
        assert f.name in DEFAULTS, f"{f.name} is not an option"
        assert f.default == DEFAULTS[f.name], f.name
    settings = RunSettings.from_options({"reps": 300, "max_reps": 200, "timeout": "12"}.get)
    assert settings.max_reps == 300 and settings.timeout == 12.0


def test_a_speedup_series_is_ordered_as_the_jobs_ran(tmp_path):
    series = iter([3e-3, 2e-3, 1e-3, 1e-3])
    jobs = _jobs(tmp_path, times=lambda role, n: next(series) if role == "ref" and n > 1
                 else 1e-3)
    plan = _plan(tmp_path, timing_rounds=2, timing_max_rounds=2)
    got = measure(plan, {"ref": jobs.ref, "sol": jobs.sol}, jobs, lambda: Load())
    sizes, _ = figures(plan, got)
    assert np.allclose(sizes[0].jobs_ref_us, [3000 * 1.002, 2000 * 1.002], rtol=1e-6)


def test_help_texts_take_their_defaults_from_the_option_table():
    from pytest_commbench.session import OPTIONS

    for option in OPTIONS:
        assert "{default}" not in option.text
        if "{default}" in option.help:
            shown = (f"{option.default:g}" if isinstance(option.default, float)
                     else str(option.default))
            assert f"default {shown}" in option.text or f"default: {shown}" in option.text
    texts = {o.name: o.text for o in OPTIONS}
    assert "(default 10)" in texts["reps"] and "(default 900;" in texts["request_timeout"]
    assert "(default 0.25;" in texts["timing_budget"]


MEMCHECK_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at copy_kernel(const float *, float *, unsigned long)+0x70
=========     by thread (31,0,0) in block (3,0,0)
=========     Address 0x7f3a00001000 is out of bounds
=========
========= Invalid __global__ write of size 4 bytes
=========     at copy_kernel(const float *, float *, unsigned long)+0x70
=========
========= ERROR SUMMARY: 2 errors
"""


def test_the_checkers_first_report_is_the_message(tmp_path):
    import os

    from pytest_commbench.engine.job import sanitizer_findings

    out = tmp_path / "out"
    out.mkdir()
    # the logs lie in the job's reach: a FIFO (whose open would wait forever) or a link to
    # the reference is no log
    os.mkfifo(out / "sanitizer_r0.txt")
    (tmp_path / "secret").write_text(MEMCHECK_LOG)
    (out / "sanitizer_r1.txt").symlink_to(tmp_path / "secret")
    assert sanitizer_findings(out, 2, "memcheck") is None
    (out / "sanitizer_r0.txt").unlink()
    (out / "sanitizer_r1.txt").unlink()
    tmp_path = out
    (tmp_path / "sanitizer_r0.txt").write_text("========= COMPUTE-SANITIZER\n"
                                               "========= ERROR SUMMARY: 0 errors\n")
    assert sanitizer_findings(tmp_path, 2, "memcheck") is None  # rank 1 wrote nothing
    (tmp_path / "sanitizer_r1.txt").write_text(MEMCHECK_LOG)
    message, detail = sanitizer_findings(tmp_path, 2, "memcheck")
    assert message == ("compute-sanitizer memcheck found 2 error(s) on rank 1: Invalid "
                       "__global__ write of size 4 bytes")
    assert "by thread (31,0,0)" in detail and "out of bounds" in detail
    assert "ERROR SUMMARY" not in detail


def test_each_rank_runs_under_the_checker_inside_the_launch(tmp_path):
    from pytest_commbench.platforms.base import Platform

    argv = Platform.launch_argv(SimpleNamespace(), 2, tmp_path / "job.json",
                                ("cs", "--tool", "memcheck"))
    # the launcher starts the checker, the checker the rank: mpiexec -n 2 ... cs ... python
    i = argv.index("cs")
    assert argv[1:3] == ["-n", "2"] and argv[i:i + 3] == ["cs", "--tool", "memcheck"]
    assert argv[i + 3:] == [sys.executable, "-m", "commbench_rank", str(tmp_path / "job.json")]
