"""--commbench-resume: a killed run is finished in its own directory and log, with its seed;
items it finished are not run again, and no item is counted twice."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_commbench.cli import main
from pytest_commbench.results import ResultsLog

NP2 = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"
NP3 = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np3]"


def _two_items(bench):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace("ranks = [2]", "ranks = [2, 3]"))


def _log(bench):
    (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir()]
    return run, run / "results.jsonl"


def _kill_mid_run(log, cut_line: bool) -> str:
    """What a kill while the last item ran leaves: its result line gone (or half written).
    Returns that item's node id."""
    lines = log.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if json.loads(line)["event"] == "result")
    nodeid = json.loads(lines[last])["nodeid"]
    kept = lines[:last] + lines[last + 1:]
    if cut_line:
        kept.append(lines[last][: len(lines[last]) // 2])  # no newline: cut mid-write
    log.write_text("".join(kept))
    return nodeid


@pytest.mark.parametrize("args, cut_line", [([], False), (["-n", "2"], True)])
def test_a_killed_run_resumes_running_only_what_it_had_not_finished(bench, args, cut_line):
    if args:
        pytest.importorskip("xdist")
    _two_items(bench)
    first = bench.run("-p", "no:randomly")
    first.assert_outcomes(passed=2)
    run, log = _log(bench)
    seed = json.loads((run / "run.json").read_text())["seed"]
    before = [json.loads(line) for line in log.read_text().splitlines()]
    missing = _kill_mid_run(log, cut_line)
    done = ({NP2, NP3} - {missing}).pop()

    result = bench.run(f"--commbench-resume={run.name}", "--junitxml=out.xml", *args)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"*seed={seed} *", f"*resuming run {run.name}: 1 items*",
                                 "Pass Rate 100.0% (1/1)*"])  # one task of two world sizes
    assert [p for p in (bench.root / "runs").iterdir() if p.is_dir()] == [run]  # no new run
    after = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")
             and line.endswith("}")]
    new = after[len(before) - 1:]  # the log kept all but the lost result line
    # only the missing item ran again: one started line and one result line, for it alone
    assert [(e["event"], e["nodeid"]) for e in new] == [("started", missing), ("result", missing)]
    assert new[1]["seed"] == seed and new[1]["verdict"] == "pass"
    # the item finished before the kill is reported from its record, also in the JUnit XML
    recorded = next(e for e in before if e["event"] == "result" and e["nodeid"] == done)
    cases = {c.get("name"): c for c in ET.parse(bench.root / "out.xml").iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases[done.split("::")[1]].iter("property")}
    assert json.loads(props["commbench.record"])["seed"] == recorded["seed"] == seed
    assert props["commbench.verdict"] == "pass"
    # the run's report counts each item once, and the task once
    report = bench.pytester.run(sys.executable, "-m", "pytest_commbench.cli", "report", str(run))
    report.stdout.fnmatch_lines(["Pass Rate 100.0% (1/1)*"])
    assert len(json.loads((run / "run.json").read_text())["resumed"]) == 1


def test_a_recorded_failure_stays_a_failure_when_resumed(bench):
    _two_items(bench)
    bench.run("--commbench-model=template").assert_outcomes(failed=2)
    run, log = _log(bench)
    missing = _kill_mid_run(log, cut_line=False)
    result = bench.run("--commbench-model=template", f"--commbench-resume={run}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*verdict runtime_error (recorded by run*, resumed)*",
                                 "Pass Rate 0.0% (0/1)*"])
    started = [json.loads(x)["nodeid"] for x in log.read_text().splitlines()
               if json.loads(x)["event"] == "started"]
    assert started.count(missing) == 2 and len(started) == 3


@pytest.mark.parametrize("args, message", [
    (["--commbench-seed=1"], "a resumed run keeps its seed"),
    (["--commbench-model=template"], "is of model 'reference', not 'template'"),
])
def test_a_resume_that_would_change_the_run_is_a_usage_error(bench, args, message):
    bench.add_task()
    bench.run("--commbench-seed=2").assert_outcomes(passed=1)
    run, _ = _log(bench)
    result = bench.run(f"--commbench-resume={run.name}", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    ok = bench.run(f"--commbench-resume={run.name}", "--commbench-seed=2")
    ok.assert_outcomes(passed=1)  # the same seed is fine (the item is reported, not rerun)


def test_the_report_counts_an_item_of_one_model_once_over_several_logs(tmp_path):
    common = {"model": "m", "task": "t", "title": "T", "category": "c", "library": "mpi",
              "difficulty": "easy", "setup": "bare-metal", "world": 2, "kind": "solution",
              "event": "result", "sizes": []}
    first, second = ResultsLog(tmp_path / "a.jsonl"), ResultsLog(tmp_path / "b.jsonl")
    first.write({**common, "nodeid": "x", "task": "x", "verdict": "wrong_answer"})
    first.write({**common, "nodeid": "y", "task": "y", "verdict": "pass", "speedup": 1.0})
    second.write({**common, "nodeid": "x", "task": "x", "verdict": "pass",
                  "speedup": 1.0})  # a later rerun
    second.write({**common, "event": "started", "nodeid": "y", "task": "y"})  # y stands
    second.write({**common, "nodeid": "z", "verdict": "pass", "speedup": 1.0, "model": "n"})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(first.path), str(second.path)]) == 0
    text = out.getvalue()
    assert "commbench: model m" in text and "commbench: model n" in text
    assert "Pass Rate 100.0% (2/2)" in text  # x once (the later pass), y once
    assert "Pass Rate 100.0% (1/1)" in text  # model n


RUNS_DIR_SEEN = """
import json
from pathlib import Path

from pytest_commbench.session import STATE


def pytest_collection_finish(session):
    state = session.config.stash[STATE]
    Path("runs-dir-seen").write_text(str(state.runs_dir))
"""


def test_a_run_resumed_by_its_path_keeps_its_own_runs_folder(bench):
    """`--commbench-resume PATH` of a run kept in another runs folder: its kept replies are
    those beside it (PATH/../replies), not the current runs folder's, so nothing it asked
    is asked again."""
    bench.add_task()
    other = bench.root / "elsewhere"
    bench.run("--commbench-model=reference", f"--commbench-runs-dir={other}")
    (run,) = [p for p in other.iterdir() if p.is_dir() and p.name != "replies"]
    (bench.root / "conftest.py").write_text(RUNS_DIR_SEEN)
    bench.run("--commbench-model=reference", f"--commbench-resume={run}")
    assert Path(bench.root / "runs-dir-seen").read_text() == str(other.resolve())
