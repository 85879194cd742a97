"""The plugin end to end through pytester: collection, verdicts, timing, reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

NODE = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"


def test_reference_passes_and_reports_scores(bench):
    bench.timed()
    bench.add_task()
    result = bench.run("--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*commbench: model=reference platform=cpu seed=*",
        "*commbench: model reference on cpu*",
        "collective/ring_allreduce*2*pass*",
        "Pass Rate 100.0% (1/1)*",
        "difficulty*tasks*pass*",
        "category*", "library*",
    ])
    # the speedup scores, or (a contended host: the harness's own word) why they are left out
    head = next(line for line in result.stdout.lines if line.startswith("Pass Rate 100.0%"))
    assert ("GM-Speedup" in head and "Pass x GM" in head) or \
        "PASS+Good and GM-Speedup left out: every passing item was timed on a contended host" \
        in result.stdout.str(), head
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


def test_template_fails(bench):
    bench.add_task()
    result = bench.run("--commbench-model=template")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: runtime_error*", "*NotImplementedError*",
                                 "Pass Rate 0.0% (0/1)*"])


def test_mutants_are_each_an_item_and_all_rejected(bench):
    bench.add_task()
    result = bench.run("--commbench-model=mutants", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*np2-mutant-floor_chunks? PASSED*", "mutants rejected: 3/3"])


def test_a_mutant_that_gets_through_fails_loudly(bench):
    bench.add_task()
    mutants = bench.root / "references" / "collective" / "ring_allreduce" / "mutants"
    (mutants / "actually_right.py").write_text(
        (bench.root / "references" / "collective" / "ring_allreduce" / "solution.py").read_text())
    result = bench.run("--commbench-model=mutants", "-k", "actually_right")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*MUTANT SURVIVED*", "*SURVIVED:*actually_right*"])


@pytest.mark.parametrize(
    "case, verdict, needle",
    [
        ("wrong_rank0", "wrong_answer", "rank 1: output 'recvbuf'"),
        ("tampered", "tampered", "outside the editable regions"),
        ("forbidden", "forbidden", "Allreduce"),
        ("syntax_error", "compile_error", "does not compile"),
        ("raises", "runtime_error", "chunk bounds went negative"),
        ("crash", "runtime_error", "rank 1 died"),
        ("exit_early", "runtime_error", "died"),
        ("cache", "wrong_answer", "trial 1"),
        ("reply_no_code", "no_solution", "no code between COMMBENCH EDIT markers"),
    ],
)
def test_bad_solutions_get_their_verdict(bench, case, verdict, needle):
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{bench.solution_dir(case)}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*verdict: {verdict}*"])
    assert needle in result.stdout.str()
    (record,) = bench.records()
    assert record["verdict"] == verdict


def test_printing_success_decides_nothing(bench):
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{bench.solution_dir('exit_early')}")
    result.assert_outcomes(failed=1)
    assert "ALL RESULTS CORRECT" in result.stdout.str()  # quoted in the report, not believed


def test_a_reply_with_only_the_region_is_merged_and_passes(bench):
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{bench.solution_dir('reply_regions')}")
    result.assert_outcomes(passed=1)


def test_a_dir_model_is_named_by_its_folder_in_every_report(bench, tmp_path):
    """`dir:PATH` is named `dir:<folder>` in the summary, the log, run.json, `commbench runs`
    and `commbench report`: the absolute path of one machine is in none of them (issue 41)."""
    import shutil

    answers = tmp_path / "deep" / "kimi-answers"
    shutil.copytree(bench.solution_dir("reply_regions"), answers)
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{answers}")
    result.assert_outcomes(passed=1)
    assert "commbench: model dir:kimi-answers on cpu" in result.stdout.str()
    (record,) = bench.records()
    assert record["model"] == "dir:kimi-answers"
    (run,) = (bench.root / "runs").glob("*/run.json")
    assert '"model": "dir:kimi-answers"' in run.read_text()
    for argv in (["runs", "runs"], ["report", "runs"]):
        done = subprocess.run([sys.executable, "-m", "pytest_commbench.cli", *argv],
                              cwd=bench.root, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "dir:kimi-answers" in done.stdout and str(tmp_path / "deep") not in done.stdout


def test_missing_solution_is_no_solution(bench, tmp_path):
    bench.add_task()
    (tmp_path / "empty").mkdir()
    result = bench.run(f"--commbench-model=dir:{tmp_path / 'empty'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: no_solution*"])


def test_the_timing_wall_bounds_the_repetitions_and_each_jobs_phases_are_recorded(bench):
    bench.timed()
    bench.add_task()
    # ten repetitions asked, none of the observer's time allowed: three a size, the floor
    bench.run("--commbench-reps=10", "--commbench-timing-wall=0").assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["sizes"] and all(s["n"] == 3 for s in record["sizes"])
    # where the item's time went: every job's start-up, cases and end
    assert set(record["job_phases_s"]) == {"check", "warmup", "ref0", "sol0"}
    assert all(len(p) == 3 and min(p) >= 0 for p in record["job_phases_s"].values())


def test_a_slower_solution_gets_a_speedup_below_one(bench):
    bench.timed()
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{bench.solution_dir('slow')}",
                       "--commbench-reps=5", "--commbench-timing-rounds=2",
                       "--commbench-timing-max-rounds=2", "--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    # the slow solution sleeps 3 ms per call; the reference needs far less at most sizes (how
    # much less depends on the host's load: the bounds hold where the harness saw none; a
    # timing the harness itself calls contended asserts nothing but its band)
    if record["timing_trust"] != "contended":
        assert record["speedup"] < 1.0
    if record["timing_trust"] == "ok":
        assert record["speedup"] < 0.5
        assert sorted(s["speedup"] for s in record["sizes"])[2] < 0.7  # the median size
    lo, hi = record["speedup_ci90"]
    assert lo < record["speedup"] < hi
    # a band where the host was not busy with other work meanwhile (other tests' busy loops
    # under xdist make the interval wide and the timing contended)
    assert record["timing_trust"] in ("ok", "noisy", "contended")
    if record["timing_trust"] == "contended":
        assert record["band"] == "inconclusive"
    elif record["timing_trust"] == "ok":
        assert hi < 0.6 and record["band"] == "Severely degraded", record["host_load"]
    else:  # noisy: a wide interval, never a band that calls the slower solution good
        assert record["band"] in ("Severely degraded", "Degraded", "inconclusive"), record
    xml = (bench.root / "out.xml").read_text()
    assert f'name="commbench.timing_trust" value="{record["timing_trust"]}"' in xml
    assert 'name="commbench.speedup_ci90_hi"' in xml


def _spinners(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.parametrize("model", ["slow"])
def test_timing_under_outside_load_is_contended_not_a_confident_band(bench, model):
    """Busy loops on every CPU (twice over) while an item is timed: its speedup is marked
    `contended`, its band is inconclusive and the summary says why."""
    bench.timed()
    bench.add_task()
    spin = _spinners(2 * (os.cpu_count() or 1))
    try:
        who = "reference" if model == "reference" else f"dir:{bench.solution_dir(model)}"
        result = bench.run(f"--commbench-model={who}", "--commbench-timing-rounds=2",
                           "--commbench-timing-max-rounds=2")
    finally:
        for p in spin:
            p.kill()
            p.wait()
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["timing_trust"] == "contended", record["host_load"]
    assert record["host_load"]["outside_cpus"] > 0.5
    assert record["band"] == "inconclusive"
    result.stdout.fnmatch_lines(["*contended*inconclusive*",
                                 "speedups not to be read as they stand (1): *ring_allreduce np2 "
                                 "(contended: 2 busy ranks and * CPUs of other load on * CPUs)"])


def test_check_only_runs_no_reference_job_and_times_nothing(bench):
    bench.add_task()
    bench.run("--commbench-check-only", "--commbench-keep").assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["check_only"] and record["speedup"] is None and record["sizes"] == []
    assert "timing_trust" not in record and record["band"] == ""
    jobs = {p.parent.parent.name for p in (bench.root / "runs").glob("*/work/*/*/ro/job.json")}
    assert jobs == {"sol0"}  # no warm-up, no reference job
    # it still judges: the template fails and every mutant is rejected
    bench.run("--commbench-check-only", "--commbench-model=template").assert_outcomes(failed=1)
    result = bench.run("--commbench-check-only", "--commbench-model=mutants")
    assert result.ret == 0 and "passed" in result.stdout.str()
    result = bench.run("--commbench-check-only",
                       f"--commbench-model=dir:{bench.solution_dir('wrong_rank0')}")
    result.assert_outcomes(failed=1)


def test_the_timing_rounds_show_in_the_table_and_the_junit_properties(bench):
    """When rounds are added and when not is the engine's (tests/test_engine.py, with a fake
    job runner); here the count reaches the terminal table and the JUnit properties."""
    bench.timed()
    bench.add_task(ranks=2)
    result = bench.run("--commbench-timing-rounds=2", "--commbench-timing-max-rounds=2",
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


def test_a_hanging_rank_is_killed_and_the_next_item_runs(bench, processes_with):
    bench.add_task()
    bench.add_task(name="ring_allreduce_after")  # runs after the hang, must pass
    hang = bench.root / "hang"
    src = bench.solution_dir("hang") / "collective" / "ring_allreduce" / "solution.py"
    (hang / "collective" / "ring_allreduce").mkdir(parents=True)
    (hang / "collective" / "ring_allreduce" / "solution.py").write_text(src.read_text())
    ref = bench.root / "references" / "collective" / "ring_allreduce_after" / "solution.py"
    (hang / "collective" / "ring_allreduce_after").mkdir(parents=True)
    (hang / "collective" / "ring_allreduce_after" / "solution.py").write_text(ref.read_text())
    start = time.monotonic()
    result = bench.run(f"--commbench-model=dir:{hang}", "--commbench-timeout=5", "-p", "no:randomly")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*verdict: timeout*", "*did not finish within 5 s*"])
    verdicts = bench.verdicts()
    assert verdicts[NODE] == "timeout"
    assert verdicts["suites/collective/ring_allreduce_after/task.toml::ring_allreduce_after[np2]"] == "pass"
    (timed_out,) = [r for r in bench.records() if r["verdict"] == "timeout"]
    assert timed_out["duration_s"] < 5 + 10
    # the message says where each rank was: rank 0 never came back from its first call
    # (rank 1 did), and rank 0's watchdog wrote its Python stack, in the solution's Recv
    detail = timed_out["detail"]
    assert "call 1: rank 0: in the call" in detail, detail
    assert "rank 1: finished it" in detail, detail
    assert "rank 0's Python stack near the deadline" in detail and "solution.py" in detail, detail
    assert elapsed < 5 + 10 + 60
    assert [p for p in processes_with(b"commbench_rank")
            if str(bench.root).encode() in open(f"/proc/{p}/cmdline", "rb").read()] == []


def test_malformed_manifest_is_a_collection_error_naming_file_and_key(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace('difficulty = "medium"', 'difficulty = "tough"'))
    result = bench.run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*task.toml: key 'difficulty': 'tough' is not one of easy, medium, hard*"])
    assert "Traceback" not in result.stdout.str()


def test_selection_by_keyword_and_marker(bench):
    bench.add_task()
    bench.add_task("utility/dissemination_barrier")
    result = bench.run("--collect-only", "-q", "-m", "category_utility")
    result.stdout.fnmatch_lines(["*1/2 tests collected (1 deselected)*"])
    assert "suites/utility/dissemination_barrier/task.toml::dissemination_barrier[np2]" in result.stdout.lines
    result = bench.run("--collect-only", "-q", "-k", "ring_allreduce")
    result.stdout.fnmatch_lines(["*1/2 tests collected (1 deselected)*"])
    assert NODE in result.stdout.lines
    result = bench.run("--collect-only", "-q", "-m", "difficulty_medium and library_mpi")
    result.stdout.fnmatch_lines(["*2 tests collected*"])


def test_every_library_a_manifest_may_name_is_a_registered_marker(bench):
    """Tasks of libraries added later (rccl, hip-runtime) select without an unknown-mark warning."""
    manifest = bench.add_task() / "task.toml"
    manifest.write_text(manifest.read_text().replace('library = "mpi"', 'library = "hip-runtime"'))
    result = bench.run("--collect-only", "-q", "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning",
                       "-m", "library_hip_runtime")
    result.stdout.fnmatch_lines(["*1 test collected*"])
    assert "Unknown" not in result.stdout.str()


def test_a_node_id_selects_one_item(bench):
    bench.add_task()
    bench.add_task("utility/dissemination_barrier")
    result = bench.pytester.runpytest_subprocess(NODE, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*1 test collected*"])
    assert NODE in result.stdout.lines


def test_platform_that_cannot_run_a_task_skips_it_with_the_reason(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace('platforms = ["cpu"]', 'platforms = ["h200"]'))
    result = bench.run("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*task runs on h200, not on platform cpu*"])


def test_xdist_gives_the_same_verdicts_as_a_serial_run(bench):
    pytest.importorskip("xdist")
    bench.add_task()
    # four ranks: with two, a one-round dissemination barrier is a correct barrier
    bench.add_task("utility/dissemination_barrier", ranks=None)
    serial = bench.run("--commbench-model=mutants", "--commbench-seed=7")
    serial.assert_outcomes(passed=6)
    first = bench.verdicts()
    for log in (bench.root / "runs").glob("*/results.jsonl"):
        log.unlink()
    parallel = bench.run("--commbench-model=mutants", "--commbench-seed=7", "-n", "2")
    parallel.assert_outcomes(passed=6)
    parallel.stdout.fnmatch_lines(["*commbench: model mutants on cpu*", "mutants rejected: 6/6"])
    assert bench.verdicts() == first


def test_the_seed_reproduces_the_inputs(bench):
    """The inputs exist only in the observer's memory: a solution that keeps the first input
    it was given (in its scratch, kept with --commbench-keep) shows them."""
    bench.add_task()
    ref = bench.root / "references" / "collective" / "ring_allreduce" / "solution.py"
    text = ref.read_text()
    marker = "    # >>> COMMBENCH EDIT allreduce\n"
    keep = ('    import os\n    _first = os.path.join(str(ctx.scratch), "first.npy")\n'
            '    if not os.path.exists(_first):\n        np.save(_first, sendbuf)\n')
    dump = bench.root / "dump" / "collective" / "ring_allreduce"
    dump.mkdir(parents=True)
    (dump / "solution.py").write_text(text.replace(marker, marker + keep))
    model = f"--commbench-model=dir:{bench.root / 'dump'}"

    def first_input(run: Path) -> bytes:
        return sorted((run / "work").glob("*/sol0/scratch/r1/first.npy"))[0].read_bytes()

    bench.run("--commbench-seed=1234", "--commbench-keep", model).assert_outcomes(passed=1)
    bench.run("--commbench-seed=1234", "--commbench-keep", model).assert_outcomes(passed=1)
    runs = sorted(p for p in (bench.root / "runs").iterdir() if p.is_dir())
    inputs = [first_input(r) for r in runs]
    assert inputs[0] == inputs[1]
    other = bench.run("--commbench-seed=1235", "--commbench-keep", model)
    other.assert_outcomes(passed=1)
    new = [r for r in sorted((bench.root / "runs").iterdir()) if r.is_dir() and r not in runs][0]
    assert first_input(new) != inputs[0]


def test_results_log_has_started_and_result_lines_and_the_report_command_reads_it(bench):
    bench.add_task()
    bench.run()
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
    result = bench.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_every_world_size_of_the_manifest_is_an_item_and_runs(bench):
    """World sizes other than the default: 3 (not a power of two) and 8 ranks on the CPU."""
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace("ranks = [2]", "ranks = [3, 8]"))
    result = bench.run("-v")
    result.assert_outcomes(passed=2)
    verdicts = bench.verdicts()
    assert {n.split("::")[1] for n in verdicts} == {"ring_allreduce[np3]", "ring_allreduce[np8]"}
    result = bench.run("--commbench-model=mutants", "-k", "np8")
    result.assert_outcomes(passed=3)


def test_scratch_goes_where_asked_and_the_results_log_stays_in_the_runs_dir(bench, tmp_path):
    bench.add_task()
    scratch = tmp_path / "fast"
    result = bench.run(f"--commbench-scratch={scratch}", "--commbench-keep")
    result.assert_outcomes(passed=1)
    (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir()]
    assert (run / "results.jsonl").is_file()
    assert not (run / "work").exists()
    kept = list((scratch / run.name / "work").glob("*/sol0/ro/job.json"))
    assert len(kept) == 1


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


def test_every_call_of_a_timed_batch_is_checked(bench):
    """Short calls are timed in batches of calls back to back; a solution that is right on
    every call after a pause (the trials, each batch's first call) and wrong on the calls
    that follow it within microseconds is a wrong answer, named by its call in the batch."""
    bench.timed()
    bench.add_task(ranks=1)
    # without the stress phase (which catches it first, below) the timed batches do
    result = bench.run(f"--commbench-model=dir:{bench.solution_dir('burst_skip')}",
                       "--commbench-stress=0")
    result.assert_outcomes(failed=1)
    (record,) = bench.records()
    assert record["verdict"] == "wrong_answer", record["message"]
    assert "timed repetition" in record["message"] and "back to back" in record["message"]
    bench.run(f"--commbench-model=dir:{bench.solution_dir('burst_skip')}",
              "--commbench-check-only").assert_outcomes(failed=1)
    record = bench.records()[-1]
    assert record["verdict"] == "wrong_answer" and "calls back to back" in record["message"]
    # the reference on one rank: small sizes are batched, the same for both roles
    bench.run().assert_outcomes(passed=1)
    sizes = bench.records()[-1]["sizes"]
    assert sizes[0]["batch"] > 1 and all(s["batch"] >= 1 for s in sizes)


def test_a_batch_whose_calls_differ_in_shape_hands_each_call_buffers_of_its_own(bench):
    """MoE combine: each call's routing is drawn afresh, so the calls of a timed batch have
    inputs of different shapes; each call gets buffers of its own shape (its inputs through
    the feed) and the reference passes against itself."""
    bench.timed()
    bench.add_task("ep/moe_combine", ranks=2, sizes=[5, 128])
    bench.run("--commbench-timing-max-rounds=1").assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["verdict"] == "pass", record["message"]
    if not any(s["batch"] > 1 for s in record["sizes"]) and record["timing_trust"] != "ok":
        # batches grow from the warm-up's time per call, which a loaded host stretches
        pytest.skip(f"no call was batched on a host the harness saw as "
                    f"{record['timing_trust']}: the batch path was not reached")
    assert any(s["batch"] > 1 for s in record["sizes"]), record["sizes"]


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


SIGINT_IN_A_DESTRUCTOR = '''
import os
import signal
from pathlib import Path


class Client:
    def __del__(self):  # as an SDK client's: the KeyboardInterrupt raised here is swallowed
        os.kill(os.getpid(), signal.SIGINT)


def test_a():
    Client()


def test_b():
    Path("b-ran").write_text("yes")
'''


def test_ctrl_c_stops_the_run_even_where_its_keyboardinterrupt_was_swallowed(bench):
    """SIGINT arriving inside a destructor raises KeyboardInterrupt there, which Python only
    prints: the run stops after that item all the same (it went on before)."""
    (bench.root / "suites").mkdir(exist_ok=True)
    (bench.root / "suites" / "test_sigint.py").write_text(SIGINT_IN_A_DESTRUCTOR)
    result = bench.run("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    assert not (bench.root / "b-ran").exists()


def test_a_k_that_matches_no_task_points_to_commbench_tasks(bench):
    bench.add_task()
    result = bench.run("-k", "no_such_task")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*no task item matched -k 'no_such_task'*commbench tasks*"])
