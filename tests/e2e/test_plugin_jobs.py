"""The plugin end to end through pytester, with real jobs (MPI ranks under the observer):
verdicts of real answers, timing, hung ranks, xdist, interruption."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

NODE = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"


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


def _spinners(n: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_busy_loops_on_every_cpu_are_outside_load_that_makes_a_timing_contended():
    """Busy loops on every CPU (twice over) while an item would be timed: the harness's
    measure of the load (`timing.HostLoad`) sees them as load from outside the item and the
    timing as contended (what that does to the item's band and the summary is
    tests/unit/test_plugin.py's, with the fake runner's load)."""
    from pytest_commbench.timing import HostLoad

    load = HostLoad()
    spin = _spinners(2 * (os.cpu_count() or 1))
    try:
        time.sleep(0.2)
        load.start()
        time.sleep(1.0)
        seen = load.stop(busy_ranks=2)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert seen["contended"] and seen["outside_cpus"] > 0.5, seen


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
