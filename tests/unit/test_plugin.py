"""The plugin through pytester, in this process: collection, selection, options, and what the
session, the records, the summary and the JUnit properties make of an item's verdict and times,
with a fake job runner (tests/fake_runner.py: no rank launched). What real ranks do is
tests/e2e/test_plugin_jobs.py's."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from fake_runner import FakeJobs

NODE = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"


def test_reference_passes_and_reports_scores(bench):
    bench.timed(alone=False)
    bench.add_task()
    result = bench.run_fake("--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*commbench: model=reference platform=cpu seed=*",
        "*commbench: model reference on cpu*",
        "collective/ring_allreduce*2*pass*",
        "Pass Rate 100.0% (1/1)*",
        "difficulty*tasks*pass*",
        "category*", "library*",
    ])
    # the speedup scores (the fake host is not contended: they are shown)
    head = next(line for line in result.stdout.lines if line.startswith("Pass Rate 100.0%"))
    assert "GM-Speedup" in head and "Pass x GM" in head, head
    (record,) = bench.records()
    assert record["verdict"] == "pass" and record["kind"] == "solution"
    assert len(record["sizes"]) == 5 and all(s["speedup"] > 0 for s in record["sizes"])
    # one median per timed job and role (rounds = 1 here), in the time unit of the sizes
    for s in record["sizes"]:
        assert len(s["jobs_ref_us"]) == len(s["jobs_sol_us"]) == 1
        assert s["jobs_sol_us"][0] == pytest.approx(s["t_sol_us"])
    assert record["fingerprint"]["platform"] == "cpu"
    props = {p.get("name"): p.get("value")
             for p in ET.parse(bench.root / "out.xml").iter("property")}
    assert props["commbench.verdict"] == "pass"
    assert "commbench.size.1001.float64.speedup" in props
    assert "commbench.size.65537.float64.busbw_GB/s" in props


def test_missing_solution_is_no_solution(bench, tmp_path):
    bench.add_task()
    (tmp_path / "empty").mkdir()
    result = bench.run_fake(f"--commbench-model=dir:{tmp_path / 'empty'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: no_solution*"])


def _slow_solution(cpus: int = 64, outside_cpus: float = 0.0) -> FakeJobs:
    """Jobs where each call of the solution takes 3 ms and the reference's 1 ms, each job
    0.5% off the last (a scatter to make an interval of)."""
    def times(role, task, n):
        return (3e-3 if role == "sol" else 1e-3) * (1 + 0.005 * (n % 2))

    return FakeJobs(times=times, cpus=cpus, outside_cpus=outside_cpus)


def test_a_slower_solution_gets_a_speedup_below_one(bench):
    bench.timed(alone=False)
    bench.add_task()
    result = bench.run_fake("--commbench-reps=5", "--commbench-timing-rounds=2",
                            "--commbench-timing-max-rounds=2", "--junitxml=out.xml",
                            jobs=_slow_solution())
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    # the solution takes three times the reference's time at every size, on a host the
    # harness saw no other load on
    assert record["timing_trust"] == "ok", record["host_load"]
    assert record["speedup"] < 0.5
    assert sorted(s["speedup"] for s in record["sizes"])[2] < 0.7  # the median size
    lo, hi = record["speedup_ci90"]
    assert lo < record["speedup"] < hi
    assert hi < 0.6 and record["band"] == "Severely degraded", record
    xml = (bench.root / "out.xml").read_text()
    assert f'name="commbench.timing_trust" value="{record["timing_trust"]}"' in xml
    assert 'name="commbench.speedup_ci90_hi"' in xml


def test_timing_under_outside_load_is_contended_not_a_confident_band(bench):
    """Other load on the CPUs while an item is timed (the fake's: four CPUs' worth on two;
    that busy loops are seen so is tests/e2e/test_plugin_jobs.py's): its speedup is marked
    `contended`, its band is inconclusive and the summary says why."""
    bench.timed(alone=False)
    bench.add_task()
    result = bench.run_fake("--commbench-timing-rounds=2", "--commbench-timing-max-rounds=2",
                            jobs=_slow_solution(cpus=2, outside_cpus=4.0))
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["timing_trust"] == "contended", record["host_load"]
    assert record["host_load"]["outside_cpus"] > 0.5
    assert record["band"] == "inconclusive"
    result.stdout.fnmatch_lines(["*contended*inconclusive*",
                                 "speedups not to be read as they stand (1): *ring_allreduce np2 "
                                 "(contended: 2 busy ranks and * CPUs of other load on * CPUs)"])


def test_the_timing_rounds_show_in_the_table_and_the_junit_properties(bench):
    """When rounds are added and when not is the engine's (tests/unit/test_engine.py, with a fake
    job runner); here the count reaches the terminal table and the JUnit properties."""
    bench.timed(alone=False)
    bench.add_task(ranks=2)
    result = bench.run_fake("--commbench-timing-rounds=2", "--commbench-timing-max-rounds=2",
                            "--junitxml=j.xml")
    (record,) = bench.records()
    assert record["timing_rounds"] == 2 and len(record["sizes"][0]["jobs_sol_us"]) == 2
    result.stdout.fnmatch_lines(["*+/-*rounds*", "*ring_allreduce*pass*%*2*"])
    assert 'name="commbench.timing_rounds" value="2"' in (bench.root / "j.xml").read_text()


def test_the_speedup_uncertainty_comes_from_the_jobs_scatter():
    from pytest_commbench.timing import job_scores, speedup_uncertainty

    # two sizes; each job's times are all one value; job scores are mean log medians
    ref = [[[1.0, 1.0], [1.1]], [[2.0], [2.2]]]
    assert job_scores(ref) == pytest.approx([np.log(1.0) / 2 + np.log(2.0) / 2,
                                             np.log(1.1) / 2 + np.log(2.2) / 2])
    same = [[[1.0]] * 4, [[2.0]] * 4]  # four identical jobs per role: no scatter at all
    assert speedup_uncertainty(same, same) == 0
    assert speedup_uncertainty([[[1.0]]], [[[1.0]]]) is None  # one job: unknown
    # jobs 10% apart: pooled sd of log ~ 0.067, the error of a difference of two means of 2
    a = [[[1.0], [1.1]]]
    se = speedup_uncertainty(a, a)
    assert se == pytest.approx(np.std(np.log([1.0, 1.1]), ddof=1), rel=1e-9)
    # more jobs of the same scatter: a smaller error
    assert speedup_uncertainty([[[1.0], [1.1]] * 3], [[[1.0], [1.1]] * 3]) < se


def test_few_jobs_need_a_smaller_scatter_to_stop_adding_rounds():
    from pytest_commbench.timing import chi2_quantile, precise_enough

    # chi-square quantiles (tables: 0.4463, 1.6488, 3.0701 at 20% for 2, 4, 6 degrees)
    assert chi2_quantile(0.2, 2) == pytest.approx(-2 * np.log(0.8), rel=1e-6)
    assert [round(chi2_quantile(0.2, k), 4) for k in (4, 6)] == [1.6488, 3.0701]
    with pytest.raises(ValueError):
        chi2_quantile(0.2, 3)
    # the same estimated error: too uncertain from 2 jobs per role, enough from 6
    assert not precise_enough(0.015, 2, 0.03)
    assert precise_enough(0.015, 6, 0.03)
    assert precise_enough(0.005, 2, 0.03)  # a bandwidth-bound item stops at the minimum
    assert not precise_enough(None, 2, 0.03) and not precise_enough(0.0, 1, 0.03)


def test_malformed_manifest_is_a_collection_error_naming_file_and_key(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace('difficulty = "medium"', 'difficulty = "tough"'))
    result = bench.run_fake()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*task.toml: key 'difficulty': 'tough' is not one of easy, medium, hard*"])
    assert "Traceback" not in result.stdout.str()


def test_selection_by_keyword_and_marker(bench):
    bench.add_task()
    bench.add_task("utility/dissemination_barrier")
    result = bench.run_fake("--collect-only", "-q", "-m", "category_utility")
    result.stdout.fnmatch_lines(["*1/2 tests collected (1 deselected)*"])
    assert "suites/utility/dissemination_barrier/task.toml::dissemination_barrier[np2]" in result.stdout.lines
    result = bench.run_fake("--collect-only", "-q", "-k", "ring_allreduce")
    result.stdout.fnmatch_lines(["*1/2 tests collected (1 deselected)*"])
    assert NODE in result.stdout.lines
    result = bench.run_fake("--collect-only", "-q", "-m", "difficulty_medium and library_mpi")
    result.stdout.fnmatch_lines(["*2 tests collected*"])


def test_every_library_a_manifest_may_name_is_a_registered_marker(bench):
    """Tasks of libraries added later (rccl, hip-runtime) select without an unknown-mark warning."""
    manifest = bench.add_task() / "task.toml"
    manifest.write_text(manifest.read_text().replace('library = "mpi"', 'library = "hip-runtime"'))
    result = bench.run_fake("--collect-only", "-q", "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning",
                       "-m", "library_hip_runtime")
    result.stdout.fnmatch_lines(["*1 test collected*"])
    assert "Unknown" not in result.stdout.str()


def test_a_node_id_selects_one_item(bench):
    bench.add_task()
    bench.add_task("utility/dissemination_barrier")
    result = bench.pytester.runpytest_inprocess(NODE, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*1 test collected*"])
    assert NODE in result.stdout.lines


def test_platform_that_cannot_run_a_task_skips_it_with_the_reason(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace('platforms = ["cpu"]', 'platforms = ["h200"]'))
    result = bench.run_fake("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*task runs on h200, not on platform cpu*"])


def test_results_log_has_started_and_result_lines_and_the_report_command_reads_it(bench):
    bench.add_task()
    bench.run_fake()
    (log,) = (bench.root / "runs").glob("*/results.jsonl")
    events = [line.split('"event": ')[1].split('"')[1] for line in log.read_text().splitlines()]
    assert events == ["started", "result"]
    result = bench.pytester.run(sys.executable, "-m", "pytest_commbench.cli", "report",
                                str(bench.root / "runs"))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*commbench: model reference*", "Pass Rate 100.0% (1/1)*"])


def test_an_item_that_never_finished_shows_as_aborted(tmp_path):
    from pytest_commbench.results import ResultsLog, load

    log = ResultsLog(tmp_path / "results.jsonl")
    log.write({"event": "started", "nodeid": "a"})
    log.write({"event": "started", "nodeid": "b"})
    log.write({"event": "result", "nodeid": "b", "verdict": "pass"})
    with open(log.path, "a") as f:
        f.write('{"event": "result", "nodeid": "c", "verd')  # cut short by a crash
    verdicts = {r["nodeid"]: r["verdict"] for r in load(log.path)}
    assert verdicts == {"a": "aborted", "b": "pass"}


@pytest.mark.parametrize("args, message", [
    (["--commbench-model=nobody"], "unknown model 'nobody'"),
    (["--platform=abacus"], "unknown platform 'abacus'"),
    (["--commbench-seed=abc"], "expected an integer"),
    (["--commbench-timeout=0"], "expected seconds > 0"),
    (["--commbench-timing-precision=-0.1"], "expected a fraction >= 0"),
])
def test_bad_options_are_usage_errors(bench, args, message):
    bench.add_task()
    result = bench.run_fake(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_a_tools_output_goes_verbatim_into_its_section_and_replaces_it(tmp_path):
    from pytest_commbench.cli import main

    out, bench_md = tmp_path / "probe.txt", tmp_path / "B.md"
    out.write_text("job 0  21.3 us\n")
    args = ["include", str(out), "--out", str(bench_md), "--section", "probe", "--title", "Probe",
            "--command", "tools/probe"]
    assert main(args) == 0
    out.write_text("job 0  19.9 us\n")
    assert main(args) == 0
    text = bench_md.read_text()
    assert text.count("<!-- commbench:probe -->") == 1
    assert "19.9 us" in text and "21.3" not in text and "tools/probe" in text
    out.write_text("")
    assert main(args) == 2  # an empty output is an error, the section stays
    assert "19.9 us" in bench_md.read_text()
    assert main(["include", str(tmp_path / "missing.txt"), "--out", str(bench_md),
                 "--section", "p", "--title", "P", "--command", "c"]) == 2


def test_a_batch_is_drawn_so_that_every_ranks_inputs_fit_its_feed():
    """Calls whose inputs vary in size (MoE routing): a drawn batch whose inputs would not fit
    a rank's feed is drawn again, and where none fits the observer says so."""
    from types import SimpleNamespace

    from pytest_commbench import checks
    from pytest_commbench.observer import Observer

    op = checks.get("moe_combine")
    rng = np.random.default_rng(7)
    case = op.make_case(rng, "c0", 1000, "float32", 4,
                        {"hidden": 64, "num_experts": 16, "topk": 2}, 1, 0)

    def sizes(trials):
        return [sum(a.nbytes for t in trials for a in t.inputs[r].values()) for r in range(4)]

    drawn = [sizes([op.timed_trial(rng, case) for _ in range(4)]) for _ in range(40)]
    room = int(np.median([max(d) for d in drawn]))  # about half the batches fit
    fake = SimpleNamespace(op=op, rng=rng, world=4,
                           ranks=[SimpleNamespace(feed_bytes=room) for _ in range(4)])
    for _ in range(10):
        assert max(sizes(Observer._draw(fake, case, 4))) <= room
    fake.ranks = [SimpleNamespace(feed_bytes=min(min(d) for d in drawn) // 4)] * 4
    with pytest.raises(RuntimeError, match="none fits"):
        Observer._draw(fake, case, 4)


def test_a_k_that_matches_no_task_points_to_commbench_tasks(bench):
    bench.add_task()
    result = bench.run_fake("-k", "no_such_task")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*no task item matched -k 'no_such_task'*commbench tasks*"])
