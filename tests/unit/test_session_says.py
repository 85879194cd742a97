"""What a session says of itself, on the fake job runner (no rank launched): options that do
nothing are warned about, former option and ini names still read and named; a benchmark
session that ran nothing fails, one with a passing item succeeds; every result line says which
plugin and which version of the task made it, and reports keep changed tasks apart."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_commbench import __version__
from pytest_commbench.tasks import load_task, task_hash

REPO = Path(__file__).resolve().parents[2]


def test_options_that_do_nothing_and_former_names_are_warned_about(bench):
    bench.add_task()
    result = bench.run_fake("--commbench-rounds=3", "--commbench-budget=0",
                       "--commbench-samples=2", "--commbench-jobs-per-gpu=3")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK
    assert "--commbench-rounds does nothing for model reference" in out
    assert "--commbench-samples does nothing for model reference" in out
    assert "--commbench-budget is now --commbench-timing-budget" in out
    assert ("--commbench-jobs-per-gpu does nothing without --commbench-ranks-per-gpu above 1"
            in out)
    # check-only (the bench's default) makes the timing options idle too
    assert "--commbench-timing-budget does nothing with --commbench-check-only" in out


def test_a_former_ini_name_is_still_read_and_named(bench):
    bench.timed(alone=False).add_task()
    ini = bench.root / "pytest.ini"
    ini.write_text(ini.read_text().replace("commbench_timing_budget", "commbench_budget"))
    result = bench.run_fake("--commbench-timing-max-rounds=1")
    assert result.ret == pytest.ExitCode.OK
    assert "commbench_budget is now commbench_timing_budget" in result.stdout.str()


def test_a_session_in_which_no_item_ran_fails_saying_why(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace('platforms = ["cpu"]', 'platforms = ["h200"]'))
    result = bench.run_fake()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*no benchmark item ran: all 1 skipped (1 x task runs on h200,"
                                 " not on platform cpu)*"])


def test_a_session_with_a_passing_item_still_succeeds(bench):
    bench.add_task()
    bench.add_task("collective/ring_allreduce", name="skipped_one")
    manifest = bench.root / "suites" / "collective" / "skipped_one" / "task.toml"
    manifest.write_text(manifest.read_text().replace('platforms = ["cpu"]', 'platforms = ["h200"]'))
    result = bench.run_fake()
    assert result.ret == pytest.ExitCode.OK
    assert "no benchmark item ran" not in result.stdout.str()


def test_every_result_line_names_the_plugin_version_and_the_task_hash(bench):
    bench.add_task()
    bench.run_fake()
    (record,) = bench.records()
    task = load_task(bench.root / "suites" / "collective" / "ring_allreduce" / "task.toml",
                     bench.root / "suites")
    assert record["commbench_version"] == __version__
    assert record["task_hash"] == task_hash(task, bench.root / "references")


def test_the_task_hash_follows_the_task_its_reference_and_its_oracle(tmp_path):
    suites, refs = tmp_path / "suites", tmp_path / "references"
    rel = "collective/ring_allreduce"
    shutil.copytree(REPO / "suites" / rel, suites / rel)
    shutil.copytree(REPO / "references" / rel, refs / rel)

    def current() -> str:
        from pytest_commbench import tasks

        tasks._task_hash.cache_clear()
        return task_hash(load_task(suites / rel / "task.toml", suites), refs)

    first = current()
    assert current() == first  # nothing changed: the same
    ref = refs / rel / "solution.py"
    ref.write_text(ref.read_text() + "\n# a changed reference\n")
    second = current()
    assert second != first
    prompt = next(p for p in (suites / rel).iterdir() if p.suffix == ".md")
    prompt.write_text(prompt.read_text() + "\nOne more requirement.\n")
    assert current() not in (first, second)


def _records(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_a_report_refuses_to_pool_two_versions_of_a_task_unless_split(bench, tmp_path):
    bench.add_task()
    bench.run_fake()
    prompt = next(p for p in (bench.root / "suites" / "collective" / "ring_allreduce").iterdir()
                  if p.suffix == ".md")
    prompt.write_text(prompt.read_text() + "\nThe task changed between the runs.\n")
    from pytest_commbench import tasks

    tasks._task_hash.cache_clear()
    bench.run_fake()
    logs = sorted((bench.root / "runs").glob("*/results.jsonl"))
    assert len(logs) == 2
    hashes = {r["task_hash"] for log in logs for r in _records(log) if r["event"] == "result"}
    assert len(hashes) == 2
    cli = [sys.executable, "-m", "pytest_commbench.cli", "report", *map(str, logs)]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "different versions of the same tasks" in refused.stderr
    assert "collective/ring_allreduce" in refused.stderr
    split = subprocess.run([*cli, "--split-changed"], capture_output=True, text=True,
                           timeout=120)
    assert split.returncode == 0, split.stderr
    for h in hashes:
        assert f"collective/ring_allreduce@{h[:8]}" in split.stdout
