"""Faults: replies that are not usable text, huge records, crashed workers, bad settings and
bad manifests are each judged or refused with a reason, never a crash or an infra_error."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_commbench import regions
from pytest_commbench.models.builtin import _read, make_builtin
from pytest_commbench.results import MESSAGE_CHARS, TEXT_CHARS, ResultsLog, cap, load
from pytest_commbench.verdicts import Rejected, Verdict

TASK_DIR = "collective/ring_allreduce"
NODE = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"
OTHER = "suites/collective/ring_allreduce_after/task.toml::ring_allreduce_after[np2]"


def _lines(bench) -> list[dict]:
    out = []
    for log in sorted((bench.root / "runs").glob("*/results.jsonl")):
        out += [json.loads(line) for line in log.read_text().splitlines()]
    return out


def _reply_dir(root: Path, data: bytes, name: str = "reply.md") -> Path:
    folder = root / "replies" / TASK_DIR
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    return root / "replies"


# -- replies that are not usable text ------------------------------------------------------------

def test_a_reply_file_that_is_not_utf8_is_no_solution_saying_so(tmp_path):
    path = tmp_path / "reply.md"
    path.write_bytes(b"# >>> COMMBENCH EDIT allreduce\n    x = '\xff\xfe'\n# <<< COMMBENCH EDIT\n")
    reply = _read(path)
    assert reply.infra_error is None
    with pytest.raises(Rejected) as info:
        regions.merge_reply("# >>> COMMBENCH EDIT allreduce\n# <<< COMMBENCH EDIT\n", reply.text)
    assert info.value.verdict is Verdict.NO_SOLUTION
    assert "not valid UTF-8" in info.value.message


def test_a_huge_reply_file_is_read_no_further_than_a_solution_can_be(tmp_path):
    path = tmp_path / "solution.py"
    with open(path, "wb") as f:
        f.truncate(64 << 20)  # 64 MB of NUL bytes, no memory spent on it here
    reply = _read(path)
    assert len(reply.text) < 5 * regions.MAX_REPLY_CHARS
    with pytest.raises(Rejected) as info:
        regions.merge_reply("# >>> COMMBENCH EDIT a\n# <<< COMMBENCH EDIT\n", reply.text)
    assert info.value.verdict is Verdict.NO_SOLUTION


@pytest.mark.parametrize("data, needle", [
    (b"```python\n    # >>> COMMBENCH EDIT allreduce\n    recvbuf[:] = '\xc3\x28'\n"
     b"    # <<< COMMBENCH EDIT\n```\n", "not valid UTF-8"),
    (b"x" * (50 << 20), "characters long"),
])
def test_unusable_replies_are_the_models_failure_end_to_end(bench, data, needle):
    bench.add_task()
    replies = _reply_dir(bench.root, data)
    result = bench.run(f"--commbench-model=dir:{replies}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: no_solution*"])
    assert needle in result.stdout.str()
    (record,) = bench.records()
    assert record["verdict"] == "no_solution"


def test_a_deeply_nested_reply_is_a_compile_error_not_an_infra_error(bench):
    bench.add_task()
    body = "    recvbuf[:] = sendbuf" + " + sendbuf" * 60_000
    replies = _reply_dir(bench.root, (f"    # >>> COMMBENCH EDIT allreduce\n{body}\n"
                                      "    # <<< COMMBENCH EDIT\n").encode())
    bench.run(f"--commbench-model=dir:{replies}").assert_outcomes(failed=1)
    (record,) = bench.records()
    assert record["verdict"] == "compile_error"


# -- records are capped --------------------------------------------------------------------------

def test_every_string_of_a_results_line_is_capped_saying_how_much_was_cut(tmp_path):
    huge = "E" * (50 << 20)
    log = ResultsLog(tmp_path / "results.jsonl")
    log.write({"event": "result", "nodeid": "n", "verdict": "runtime_error", "message": huge,
               "detail": huge, "output": "start" + huge + "end", "traceback": huge,
               "sizes": [{"note": huge}], huge[:20_000]: 1, "other": ValueError(huge)})
    line = log.path.read_text()
    assert len(line) < 8 * TEXT_CHARS
    (record,) = load(log.path)
    assert len(record["message"]) <= MESSAGE_CHARS
    assert "characters cut" in record["message"]
    assert record["output"].endswith("end")  # the tail of the output is what tells
    assert len(record["detail"]) <= TEXT_CHARS and len(record["sizes"][0]["note"]) <= TEXT_CHARS
    assert len(record["other"]) <= TEXT_CHARS
    assert cap(record) == record  # capping twice changes nothing


def test_junit_properties_and_the_failure_text_use_the_capped_record():
    from pytest_commbench.items import describe, final_record, junit_properties

    class State:
        seed, fingerprint = 5, {"platform": "cpu"}

    huge = "M" * (10 << 20)
    base = {"nodeid": "n", "task": "t", "title": "T", "category": "c", "world": 2, "model": "m"}
    record = final_record(State(), base, {"verdict": "runtime_error", "message": huge,
                                          "detail": huge, "output": huge, "sizes": []})
    assert len(record["message"]) <= MESSAGE_CHARS and record["seed"] == 5
    props = dict(junit_properties(record))
    assert len(props["commbench.record"]) < 3 * MESSAGE_CHARS
    assert len(describe(record, "verdict runtime_error")) < 3 * TEXT_CHARS
    assert props["commbench.cost_usd"] == "unknown"  # no price: no $0 either
    priced = dict(junit_properties({**record, "cost": 0.25, "price_source": {"source": "x"}}))
    assert priced["commbench.cost_usd"] == 0.25


# -- the seed is written when an item ends, never before ------------------------------------------

def test_the_started_line_has_no_seed_and_the_result_line_has_it(bench):
    bench.add_task()
    result = bench.run("--commbench-seed=987654321", "--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    started, finished = _lines(bench)
    assert started["event"] == "started" and finished["event"] == "result"
    assert "seed" not in started and "987654321" not in json.dumps(started)
    assert finished["seed"] == 987654321
    (run,) = (bench.root / "runs").iterdir()
    assert json.loads((run / "run.json").read_text())["seed"] == 987654321
    props = {p.get("name"): p.get("value") for p in ET.parse(bench.root / "out.xml").iter("property")}
    assert json.loads(props["commbench.record"])["seed"] == 987654321


# -- an item that started and never ended is the model's failure ----------------------------------

def test_an_aborted_item_counts_against_the_model_in_the_report(tmp_path):
    from pytest_commbench.cli import main

    log = ResultsLog(tmp_path / "results.jsonl")
    common = {"model": "m", "task": "t", "title": "T", "category": "c", "library": "mpi",
              "difficulty": "easy", "setup": "bare-metal", "world": 2, "kind": "solution"}
    log.write({**common, "event": "started", "nodeid": "a"})
    log.write({**common, "event": "started", "nodeid": "b", "task": "u"})
    log.write({**common, "event": "result", "nodeid": "b", "task": "u", "verdict": "pass",
               "speedup": 1.0, "sizes": []})
    verdicts = {r["nodeid"]: r["verdict"] for r in load(log.path)}
    assert verdicts == {"a": "aborted", "b": "pass"}
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["report", str(log.path)]) == 0
    out = buffer.getvalue()
    assert "Pass Rate 50.0% (1/2)" in out


CRASH_CONFTEST = """
import os

import pytest_commbench.items as items

_run = items.refine


def _dies(task, *args, **kwargs):
    if task.name == "ring_allreduce":  # the solution takes its pytest worker down
        os._exit(3)
    return _run(task, *args, **kwargs)


items.refine = _dies
"""


@pytest.mark.parametrize("sandboxed", [False, True], ids=["unsandboxed", "sandboxed"])
def test_an_item_whose_xdist_worker_dies_is_written_by_the_controller(bench, sandboxed):
    """Unsandboxed, the solution's processes could have killed the worker: runtime_error.
    Sandboxed they cannot (their own PID and user namespaces): the worker was killed from
    outside, an infra_error that a resume runs again."""
    pytest.importorskip("xdist")
    bench.add_task()
    bench.add_task(name="ring_allreduce_after")
    (bench.root / "conftest.py").write_text(CRASH_CONFTEST)
    args = [] if sandboxed else ["--commbench-unsandboxed"]
    result = bench.run("-n", "1", "--junitxml=out.xml", *args)
    result.assert_outcomes(failed=1, passed=1)
    assert "the pytest worker running this item died" in result.stdout.str()
    verdicts = bench.verdicts()
    if sandboxed:
        assert verdicts == {NODE: "infra_error", OTHER: "pass"}
        (crashed,) = [r for r in bench.records() if r["nodeid"] == NODE]
        assert "killed from outside" in crashed["message"]
        # resumed: the item runs again (here its worker dies again: the conftest says so)
        (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir()
                  and p.name != "replies"]
        again = bench.run("-n", "1", f"--commbench-resume={run}")
        assert "the pytest worker running this item died" in again.stdout.str()
        assert sum(1 for r in bench.records() if r["nodeid"] == NODE) == 2
        return
    result.stdout.fnmatch_lines(["Pass Rate 50.0% (1/2)*"])
    assert verdicts == {NODE: "runtime_error", OTHER: "pass"}
    (crashed,) = [r for r in bench.records() if r["nodeid"] == NODE]
    assert crashed["message"] == "the pytest worker running this item died"
    assert crashed["task"] == TASK_DIR and crashed["seed"] is not None
    result = bench.pytester.run(sys.executable, "-m", "pytest_commbench.cli", "report",
                                str(bench.root / "runs"))
    result.stdout.fnmatch_lines(["Pass Rate 50.0% (1/2)*"])


def test_a_crashed_worker_running_a_test_of_the_users_own_is_left_to_pytest(bench):
    """Beside the tasks, a test of the project's own whose worker dies: pytest's failure, no
    task verdict invented for it (the run's records and tables hold the tasks alone)."""
    pytest.importorskip("xdist")
    bench.add_task()
    (bench.root / "test_own.py").write_text("import os\n\ndef test_dies():\n    os._exit(3)\n")
    result = bench.pytester.runpytest_subprocess(
        "suites", "test_own.py", "-p", "no:cacheprovider", "-n", "1")
    result.assert_outcomes(failed=1, passed=1)
    assert "crashed while running 'test_own.py::test_dies'" in result.stdout.str()
    assert [r["nodeid"] for r in bench.records()] == [NODE]
    assert "test_own.py  " not in result.stdout.str()  # no row of the tables


def test_help_shows_the_options_and_collecting_leaves_no_run_behind(bench):
    bench.add_task()
    result = bench.pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--commbench-resume=RUN*", "*--commbench-unsandboxed*",
                                 "*90% upper*"])
    bench.run("--collect-only").assert_outcomes()
    assert not (bench.root / "runs").exists()


def test_the_plugin_works_without_xdist(bench):
    bench.add_task()
    bench.run("-p", "no:xdist").assert_outcomes(passed=1)


# -- settings are checked wherever they come from -------------------------------------------------

def test_a_dir_model_that_does_not_exist_is_a_usage_error(bench, tmp_path):
    bench.add_task()
    result = bench.run(f"--commbench-model=dir:{tmp_path / 'nowhere'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "nowhere" in result.stderr.str() and "no directory" in result.stderr.str()
    with pytest.raises(ValueError):
        make_builtin("dir:", tmp_path)


def test_an_existing_empty_dir_model_is_no_solution(bench, tmp_path):
    bench.add_task()
    (tmp_path / "empty").mkdir()
    result = bench.run(f"--commbench-model=dir:{tmp_path / 'empty'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict: no_solution*"])


@pytest.mark.parametrize("env, ini, message", [
    ({"COMMBENCH_PLATFORM": "abacus"}, "", "COMMBENCH_PLATFORM='abacus' (environment): unknown platform 'abacus'"),
    ({}, "commbench_platform = abacus", "unknown platform 'abacus'"),
    ({"COMMBENCH_MODEL": "nobody"}, "", "COMMBENCH_MODEL='nobody' (environment): unknown model"),
    ({"COMMBENCH_TIMEOUT": "0"}, "", "COMMBENCH_TIMEOUT='0' (environment): expected seconds > 0"),
    ({"COMMBENCH_TIMEOUT": "nan"}, "", "expected seconds"),
    ({}, "commbench_timing_rounds = 0", "commbench_timing_rounds = '0' (ini file"),
    ({}, "commbench_reps = -3", "expected a whole number >= 0, got -3"),
    ({}, "commbench_timing_precision = lots", "expected a fraction, got 'lots'"),
    ({"COMMBENCH_SEED": "x12"}, "", "COMMBENCH_SEED='x12' (environment): expected an integer"),
    ({"COMMBENCH_KEEP": "maybe"}, "", "expected true or false"),
    ({"COMMBENCH_RESUME": "no-such-run"}, "", "no run 'no-such-run' to resume"),
])
def test_environment_and_ini_values_are_checked_like_the_command_line(bench, monkeypatch, env,
                                                                      ini, message):
    bench.add_task()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if ini:
        path = bench.root / "pytest.ini"
        key = ini.split("=")[0].strip()
        kept = [x for x in path.read_text().splitlines() if x.split("=")[0].strip() != key]
        path.write_text("\n".join([*kept, ini]) + "\n")
    result = bench.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert message in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("args, message", [
    (["--commbench-timing-rounds=0"], "--commbench-timing-rounds: expected a whole number >= 1, got 0"),
    (["--commbench-timing-max-rounds=x"], "--commbench-timing-max-rounds: expected a whole number, got 'x'"),
    (["--commbench-timing-budget=-1"], "--commbench-timing-budget: expected seconds >= 0"),
    (["--commbench-budget=-1"], "--commbench-budget: expected seconds >= 0"),  # former name
    (["--platform="], "--platform: expected a value"),
])
def test_bad_command_line_values_name_the_option(bench, args, message):
    bench.add_task()
    result = bench.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_an_environment_value_is_used_when_valid(bench, monkeypatch):
    bench.add_task()
    monkeypatch.setenv("COMMBENCH_SEED", "0x10")
    result = bench.run()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*seed=16 *"])


# -- bad manifests ------------------------------------------------------------------------------

@pytest.mark.parametrize("key, line, value", [
    ("platforms", 'platforms = ["cpu"]', 'platforms = ["cpu", "h2OO"]'),
    ("vendors", 'platforms = ["cpu"]', 'platforms = ["cpu"]\nvendors = ["nvidai"]'),
])
def test_a_typo_in_a_manifests_platforms_or_vendors_is_a_manifest_error(bench, key, line, value):
    suite = bench.add_task()
    manifest = suite / "task.toml"
    manifest.write_text(manifest.read_text().replace(line, value))
    result = bench.run()
    result.assert_outcomes(errors=1)
    typo = value.split('"')[-2]
    result.stdout.fnmatch_lines([f"*task.toml: key '{key}': '{typo}' is not a known *"])


@pytest.mark.parametrize("args", [[], ["-n", "2"]])
def test_one_broken_manifest_is_an_error_of_that_task_only(bench, args):
    if args:
        pytest.importorskip("xdist")
    bench.add_task()
    broken = bench.add_task(name="ring_allreduce_after") / "task.toml"
    broken.write_bytes(broken.read_bytes().replace(b'difficulty = "medium"', b'difficulty = "tough"'))
    result = bench.run(*args)
    result.assert_outcomes(errors=1, passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ring_allreduce_after/task.toml: key 'difficulty'*"])
    assert bench.verdicts() == {NODE: "pass"}


def test_a_manifest_that_is_not_utf8_is_a_manifest_error(bench):
    suite = bench.add_task()
    (suite / "task.toml").write_bytes(b'title = "\xff"\n')
    result = bench.run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*task.toml: key '<file>': not UTF-8 text*"])
    assert "Traceback" not in result.stdout.str()
