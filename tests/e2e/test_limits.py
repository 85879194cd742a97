"""Limits: a job cannot exhaust the machine (processes, tmpfs, the disk), a full disk loses no
result line, one session per run folder, a failing item keeps its evidence and not its bulk,
a task's files stay in its folder, and a correct solution's large output passes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_commbench import launch, sandbox, sandbox_init
from pytest_commbench.cli import main
from pytest_commbench.launch import run_job
from pytest_commbench.results import ResultsLog, RunBusy, RunLock, entries, load
from pytest_commbench.tasks import ManifestError, load_task

REPO = Path(__file__).resolve().parents[2]
RIGHT = REPO / "fixtures" / "solutions" / "right_naive" / "collective" / "ring_allreduce" / \
    "solution.py"
NODE = "suites/collective/ring_allreduce/task.toml::ring_allreduce[np2]"
AFTER = "suites/collective/ring_allreduce_after/task.toml::ring_allreduce_after[np2]"
MiB = 1 << 20

needs_sandbox = pytest.mark.skipif(sandbox.probe() is not None,
                                   reason=f"no job sandbox here: {sandbox.probe()}")


# -- helpers ----------------------------------------------------------------------------------

def _solution(body: str) -> str:
    """The right (naive) ring all-reduce with `body` at the end of every call."""
    code = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    return RIGHT.read_text().replace("    # <<< COMMBENCH EDIT", code + "    # <<< COMMBENCH EDIT")


def _faulty_then_healthy(bench, body: str) -> Path:
    """Two tasks, run in this order: the faulty solution, then a right one. Returns the
    `dir:` model's folder."""
    bench.add_task()
    bench.add_task(name="ring_allreduce_after")
    model = bench.root / "model" / "collective"
    (model / "ring_allreduce").mkdir(parents=True)
    (model / "ring_allreduce" / "solution.py").write_text(_solution(body))
    (model / "ring_allreduce_after").mkdir(parents=True)
    shutil.copyfile(RIGHT, model / "ring_allreduce_after" / "solution.py")
    return bench.root / "model"


def _run_dir(bench) -> Path:
    (run,) = [p for p in (bench.root / "runs").iterdir() if p.is_dir()]
    return run


def _sandboxed(tmp_path: Path, code: str, limits: dict | None = None, deadline: float = 120):
    """Run a Python probe (no guard: the sandbox alone) as a job; (job folder, result, s)."""
    job = tmp_path / "runs" / "run1" / "work" / "item" / "sol0"
    (job / "ro").mkdir(parents=True, exist_ok=True)
    script = job / "ro" / "probe.py"
    script.write_text(textwrap.dedent(code))
    argv = sandbox.wrap(job, [sys.executable, "-I", str(script)],
                        {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, hide=[],
                        limits=limits)
    start = time.monotonic()
    result = run_job(argv, job, deadline)
    return job, result, time.monotonic() - start


def _said(out: str, key: str) -> list[str]:
    """The words after `KEY` on each line the probe printed with it."""
    return [line.split(key, 1)[1].split() for line in out.splitlines() if line.startswith(key)]


# -- processes --------------------------------------------------------------------------------

FORK_BOMB = """
    import os, signal, time
    children, error = [], None
    for _ in range(3000):
        try:
            pid = os.fork()
        except OSError as exc:
            error = exc.errno
            break
        if pid == 0:
            signal.pause()
            os._exit(0)
        children.append(pid)
    print("FORKED", len(children), error, flush=True)
    time.sleep(2)  # the children alive a while: a count of the job's tasks sees them
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""


@needs_sandbox
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup-if-any", "no-cgroup"])
def test_a_fork_bomb_is_stopped_at_the_jobs_pids_limit(tmp_path, processes_with, cgroup):
    """3000 children of one job: a pids cgroup (where one can be made) or RLIMIT_NPROC (a
    host user other than root) refuses the fork past the limit; else the sandbox's first
    process counts the job's tasks and stops it. Nothing of the job is left."""
    limits = {"pids_max": 300, **({} if cgroup else {"cgroup": None})}
    job, result, took = _sandboxed(tmp_path, FORK_BOMB, limits)
    out = result.output
    said = _said(out, "FORKED")
    if said:  # the kernel refused the fork past the limit
        forked, error = int(said[0][0]), said[0][1]
        assert forked < 300 and error == str(errno.EAGAIN), out
        assert result.returncode == 0, out
        how = "cgroup" if cgroup and sandbox.pids_cgroup() else "RLIMIT_NPROC"
    else:  # counted and stopped
        assert result.returncode == sandbox.LIMIT_EXIT, out
        assert "more than its limit of 300" in out, out
        how = "count"
    found = sandbox.pids_cgroup()
    if cgroup and found is not None:
        assert how == "cgroup", out
        # the job's cgroup is gone with it
        assert not list(Path(found["parent"]).glob(f"{sandbox.CGROUP_PREFIX}{os.getpid()}-*"))
    assert took < 60
    assert processes_with(str(job / "ro" / "probe.py").encode()) == []
    print(f"fork bomb stopped by the {how}: {out.strip().splitlines()[-1]}")


@needs_sandbox
def test_a_solution_starting_3000_threads_fails_and_the_next_item_passes(bench):
    """Threads are tasks like processes (a Python solution's fork is refused by its guard
    before any limit is met): the job's pids limit stops the 3000th, the item fails, the
    next one runs as if nothing happened."""
    model = _faulty_then_healthy(bench, """
        import threading
        gate = threading.Event()
        for _ in range(3000):
            threading.Thread(target=gate.wait, daemon=True).start()
    """)
    result = bench.run(f"--commbench-model=dir:{model}", "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=1)
    assert bench.verdicts() == {NODE: "runtime_error", AFTER: "pass"}
    (bomb,) = [r for r in bench.records() if r["nodeid"] == NODE]
    assert "can't start new thread" in bomb["message"] + bomb["detail"] or \
        "more than its limit" in bomb["output"], bomb


# -- tmpfs ------------------------------------------------------------------------------------

TMPFS_FILL = """
    import os
    for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run"):
        path = os.path.join(folder, "fill")
        try:
            with open(path, "wb", buffering=0) as f:
                for _ in range(64):
                    f.write(b"t" * (1 << 20))
        except OSError as exc:
            pass
        st = os.statvfs(folder)
        print("FILLED", folder, os.path.getsize(path), st.f_blocks * st.f_frsize, flush=True)
"""


@needs_sandbox
def test_the_jobs_tmpfs_mounts_hold_no_more_than_their_size(tmp_path):
    _job, result, _took = _sandboxed(tmp_path, TMPFS_FILL, {"tmpfs_bytes": 8 * MiB})
    filled = {words[0]: (int(words[1]), int(words[2])) for words in _said(result.output,
                                                                          "FILLED")}
    assert set(filled) == {"/tmp", "/var/tmp", "/dev/shm", "/run"}, result.output
    for folder, (wrote, size) in filled.items():
        assert size == 8 * MiB, (folder, size)
        assert 4 * MiB <= wrote <= 8 * MiB, (folder, wrote)


@needs_sandbox
def test_the_default_tmpfs_sizes_are_a_share_of_memory_with_room_for_dev_shm(tmp_path):
    ram = sandbox.memory_bytes()
    sizes = sandbox.tmpfs_sizes(ram)
    assert sizes["/dev/shm"] >= min(sandbox.GiB, ram // 4)
    assert all(size <= max(ram // 4, 64 * MiB) for size in sizes.values())
    small = sandbox.tmpfs_sizes(2 * sandbox.GiB)  # a small machine: /dev/shm a quarter
    assert small["/dev/shm"] == 512 * MiB and small["/tmp"] == 128 * MiB
    _job, result, _took = _sandboxed(tmp_path, """
        import os
        for folder in ("/tmp", "/dev/shm"):
            st = os.statvfs(folder)
            print("SIZE", folder, st.f_blocks * st.f_frsize)
    """)
    seen = {words[0]: int(words[1]) for words in _said(result.output, "SIZE")}
    page = os.sysconf("SC_PAGE_SIZE")
    for folder in ("/tmp", "/dev/shm"):
        assert abs(seen[folder] - sizes[folder]) < page, (folder, seen, sizes)


# -- the job's folder on the host's disk ------------------------------------------------------

@needs_sandbox
def test_a_file_past_the_jobs_file_size_limit_is_refused(tmp_path):
    job, result, _took = _sandboxed(tmp_path, """
        import errno
        try:
            with open("big", "wb") as f:  # buffered: the write goes on after a short one
                f.write(b"b" * (8 << 20))
            print("WROTE")
        except OSError as exc:
            print("REFUSED", errno.errorcode[exc.errno])
    """, {"fsize_bytes": 4 * MiB})
    assert "REFUSED EFBIG" in result.output, result.output
    assert (job / "big").stat().st_size <= 4 * MiB


@needs_sandbox
def test_a_job_writing_past_its_folders_quota_is_stopped_saying_so(tmp_path):
    job, result, _took = _sandboxed(tmp_path, """
        import time
        for i in range(300):
            with open(f"part{i}", "wb") as f:
                f.write(b"m" * (1 << 20))
            time.sleep(0.01)
        print("ALL WRITTEN")
    """, {"scratch_bytes": 8 * MiB})
    out = result.output
    assert result.returncode == sandbox.LIMIT_EXIT, out
    assert "stopped the job: the job wrote" in out and "its quota of 8.0 MiB" in out, out
    assert "ALL WRITTEN" not in out
    used, _files = sandbox_init.usage(str(job))
    assert used < 8 * MiB + 200 * MiB  # measured every second: bounded past the quota


NEARLY_FULL = """
import sys
from pathlib import Path
from pytest_commbench import sandbox
from pytest_commbench.launch import run_job

disk = Path(sys.argv[1])
job = disk / "runs" / "run1" / "work" / "item" / "sol0"
(job / "ro").mkdir(parents=True)
(job / "ro" / "probe.py").write_text('''
import time
try:
    for i in range(1000):
        with open(f"part{i}", "wb") as f:
            f.write(b"d" * (128 << 10))
        time.sleep(0.02)
except OSError as exc:
    print("FULL", exc, flush=True)
''')
argv = sandbox.wrap(job, [sys.executable, "-I", str(job / "ro" / "probe.py")],
                    {"PATH": "/usr/bin:/bin"}, hide=[])
result = run_job(argv, job, 120)
print("CODE", result.returncode)
print(result.output)
"""


@needs_sandbox
def test_a_job_filling_the_disk_is_stopped_before_the_reserve_is_gone(tmp_path):
    """The job's folder on a 40 MiB disk of its own (a tmpfs mounted in a mount namespace
    of this test): the job is stopped once the disk's free space falls below the reserve,
    which stays free for the results log and the next item."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "controller.py"
    script.write_text(NEARLY_FULL)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f'mount -t tmpfs -o size=40m tmpfs "{disk}" && exec "{sys.executable}" "{script}" '
         f'"{disk}"'], capture_output=True, text=True, timeout=180, env=env)
    if "CODE" not in done.stdout:
        pytest.skip(f"no mount namespace for the test's own disk: {done.stderr[-500:]}")
    out = done.stdout
    assert f"CODE {sandbox.LIMIT_EXIT}" in out, out
    assert "what the disk had free above the" in out and "kept free" in out, out
    assert "FULL" not in out  # stopped before its writes met a full disk


QUOTA_CONFTEST = """
import pytest_commbench.sandbox as sandbox

sandbox.SCRATCH_BYTES = 16 << 20  # the quota and largest file of a job's folder
"""


@needs_sandbox
def test_a_solution_filling_its_folder_fails_keeps_only_evidence_and_the_next_passes(bench):
    """Past its folder's quota the job is stopped: the solution's runtime_error (never an
    infra_error), the next item passes and is logged; what the failing solution wrote is
    gone, its evidence kept."""
    (bench.root / "conftest.py").write_text(QUOTA_CONFTEST)
    model = _faulty_then_healthy(bench, """
        import os, time
        for i in range(400):
            with open(os.path.join(str(ctx.scratch), f"fill{i}"), "wb") as f:
                f.write(b"z" * (1 << 20))
            time.sleep(0.01)
    """)
    result = bench.run(f"--commbench-model=dir:{model}", "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=1)
    assert bench.verdicts() == {NODE: "runtime_error", AFTER: "pass"}
    (filler,) = [r for r in bench.records() if r["nodeid"] == NODE]
    assert "more than its quota of 16.0 MiB" in filler["output"], filler
    assert filler["message"].startswith("the job went past a limit of its sandbox and was "
                                        "stopped: the job wrote"), filler["message"]
    _assert_only_evidence(_run_dir(bench))
    report = bench.pytester.run(sys.executable, "-m", "pytest_commbench.cli", "report",
                                str(bench.root / "runs"))
    report.stdout.fnmatch_lines(["Pass Rate 50.0% (1/2)*"])


def _assert_only_evidence(run: Path) -> None:
    """What a failing item's folder may keep: its solution, and of each job the output log,
    the job file and the ranks' status, stack and guard files, each small."""
    import re

    allowed = re.compile(r"solution\.py|[a-z]+\d*/(output\.log|ro/job\.json|"
                         r"out/(status|guard)_r\d+\.json|out/stack_r\d+\.txt|out/mps\.json)")
    items = list((run / "work").iterdir())
    assert items, "the failing item's folder was removed"
    for item in items:
        for path in item.rglob("*"):
            rel = path.relative_to(item).as_posix()
            if path.is_dir() and not path.is_symlink():
                continue
            assert allowed.fullmatch(rel), f"{rel} was kept"
            assert path.stat().st_size <= 1.1 * MiB, rel


@needs_sandbox
def test_a_failing_item_keeps_its_evidence_not_its_bulk_data(bench):
    bench.add_task()
    model = bench.root / "model" / "collective" / "ring_allreduce"
    model.mkdir(parents=True)
    (model / "solution.py").write_text(_solution("""
        import os
        folder = os.path.join(str(ctx.scratch), "bulk", "deeper")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "data.bin"), "wb") as f:
            f.write(b"x" * (20 << 20))
        print("y" * (3 << 20), flush=True)
        raise ValueError("the solution gives up")
    """))
    result = bench.run(f"--commbench-model=dir:{bench.root / 'model'}")
    result.assert_outcomes(failed=1)
    (record,) = bench.records()
    assert record["verdict"] == "runtime_error" and "the solution gives up" in record["message"]
    run = _run_dir(bench)
    _assert_only_evidence(run)
    (item,) = (run / "work").iterdir()
    statuses = list(item.glob("*/out/status_r*.json"))
    assert statuses and any("the solution gives up" in p.read_text() for p in statuses)
    assert any(p.stat().st_size > 0 for p in item.glob("*/output.log"))
    assert (item / "solution.py").read_text() == (model / "solution.py").read_text()


# -- the results log on a full disk -----------------------------------------------------------

COMMON = {"model": "m", "title": "T", "category": "c", "library": "mpi", "difficulty": "easy",
          "setup": "bare-metal", "world": 2, "kind": "solution"}


def _report(path: Path) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["report", str(path)]) == 0
    return buffer.getvalue()


def _failing_write(monkeypatch, when, how: str):
    """os.write fails once for data that `when` picks: `how` "enospc" raises, "short"
    writes half of it and says so."""
    real = os.write
    failed = []

    def write(fd, data):
        if not failed and when(bytes(data)):
            failed.append(bytes(data))
            if how == "short":
                return real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return failed


@pytest.mark.parametrize("how", ["enospc", "short"])
def test_a_line_that_meets_a_full_disk_is_kept_and_no_half_line_stays(tmp_path, monkeypatch,
                                                                      how):
    log = ResultsLog(tmp_path / "results.jsonl")
    log.write({**COMMON, "event": "started", "nodeid": "a", "task": "a"})
    failed = _failing_write(monkeypatch, lambda d: b'"nodeid": "a"' in d and b'"result"' in d,
                            how)
    log.write({**COMMON, "event": "result", "nodeid": "a", "task": "a", "verdict": "pass",
               "speedup": 1.0, "sizes": []})
    assert failed and len(log.pending) == 1
    # the disk is full: the log holds whole lines only, the finished item's line waits
    lines = log.path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x) for x in lines[:-1])
    assert [e["event"] for e in entries(log.path)] == ["started"]
    # room again: the next item's lines come after the kept one, nothing lost or glued
    log.write({**COMMON, "event": "started", "nodeid": "b", "task": "b"})
    log.write({**COMMON, "event": "result", "nodeid": "b", "task": "b", "verdict": "pass",
               "speedup": 1.0, "sizes": []})
    assert not log.pending
    assert [(e["nodeid"], e["event"]) for e in entries(log.path)] == [
        ("a", "started"), ("a", "result"), ("b", "started"), ("b", "result")]
    assert {r["nodeid"]: r["verdict"] for r in load(log.path)} == {"a": "pass", "b": "pass"}
    assert "Pass Rate 100.0% (2/2)" in _report(log.path)


def test_a_torn_last_line_is_ignored_and_a_line_glued_to_a_torn_one_is_recovered(tmp_path):
    """Logs of a session killed mid-write (or written before lines were cut back): the torn
    line is no item's record; a whole line after it on the same line is found again, so its
    item is not charged as aborted."""
    path = tmp_path / "results.jsonl"
    a_started = json.dumps({**COMMON, "event": "started", "nodeid": "a", "task": "a"})
    a_result = json.dumps({**COMMON, "event": "result", "nodeid": "a", "task": "a",
                           "verdict": "pass", "speedup": 1.0, "sizes": [],
                           "fingerprint": {"platform": "cpu"}}, sort_keys=True)
    b_started = json.dumps({**COMMON, "event": "started", "nodeid": "b", "task": "b"},
                           sort_keys=True)
    b_result = json.dumps({**COMMON, "event": "result", "nodeid": "b", "task": "b",
                           "verdict": "pass", "speedup": 1.0, "sizes": []}, sort_keys=True)
    path.write_text(f"{a_started}\n{a_result[:len(a_result) // 2]}{b_started}\n{b_result}\n"
                    f"{a_result[:40]}")
    events = [(e["nodeid"], e["event"]) for e in entries(path)]
    assert events == [("a", "started"), ("b", "started"), ("b", "result")]
    verdicts = {r["nodeid"]: r["verdict"] for r in load(path)}
    assert verdicts["b"] == "pass"  # b is whole: never charged
    # resuming cuts the torn tail off, so the next line starts on a line of its own
    log = ResultsLog(path)
    log.end_cleanly()
    assert path.read_bytes().endswith(f"{b_result}\n".encode())
    log.write({**COMMON, "event": "result", "nodeid": "a", "task": "a", "verdict": "pass",
               "speedup": 1.0, "sizes": []})
    assert {r["nodeid"]: r["verdict"] for r in load(path)} == {"a": "pass", "b": "pass"}


@pytest.mark.parametrize("bad, why", [
    ({"speedup": "fast"}, "'speedup'"),
    ({"speedup": float("nan")}, "'speedup'"),
    ({"speedup": float("inf")}, "'speedup'"),
    ({"speedup": 0}, "'speedup'"),
    ({"speedup": -1.5}, "'speedup'"),
    ({"cost": -0.5}, "'cost'"),
    ({"world": "two"}, "'world'"),
    ({"sizes": "none"}, "'sizes'"),
    ({"task": None}, "'task'"),
    ({"nodeid": None}, "nodeid"),
    ({"event": "hello"}, "'event'"),
    ({"verdict": None}, "'verdict'"),
])
def test_a_record_that_lies_is_skipped_saying_where_and_the_rest_is_reported(tmp_path, capsys,
                                                                              bad, why):
    """A line edited by hand (or written by a broken tool): it parses, but a report or a
    resume cannot compute with it. It is skipped with its file, line number and reason on
    stderr; the other items are reported."""
    path = tmp_path / "results.jsonl"
    good = {**COMMON, "event": "result", "nodeid": "a", "task": "a", "verdict": "pass",
            "speedup": 1.0, "sizes": [], "fingerprint": {"platform": "cpu"}}
    liar = {**good, "nodeid": "b", "task": "b", **bad}
    path.write_text(json.dumps(good) + "\n" + json.dumps(liar) + "\n")
    assert [r["nodeid"] for r in load(path)] == ["a"]
    err = capsys.readouterr().err
    assert f"{path}:2: line skipped" in err and why in err, err
    assert "Pass Rate 100.0% (1/1)" in _report(path)


def test_a_line_that_is_no_json_object_is_named_unless_it_is_the_unfinished_end(tmp_path,
                                                                                capsys):
    """A whole line that does not parse (cut short and written after, or edited) or parses
    to no object is named with its file and line; the log's unterminated end, a write a
    crash cut short, is skipped without a word."""
    path = tmp_path / "results.jsonl"
    ok = {**COMMON, "event": "result", "nodeid": "a", "task": "a", "verdict": "pass",
          "speedup": 1.0, "sizes": []}
    path.write_text(json.dumps(ok) + "\n" + '{"event": "result", "nodeid": "b' + "\n"
                    + "[1, 2, 3]\n" + json.dumps({**ok, "nodeid": "c"}) + "\n"
                    + '{"event": "res')
    assert [r["nodeid"] for r in load(path)] == ["a", "c"]
    err = capsys.readouterr().err
    assert f"{path}:2: line skipped: not a whole JSON line" in err, err
    assert f"{path}:3: line skipped: a JSON value that is not an object" in err, err
    assert f"{path}:5:" not in err, err


def test_a_torn_line_of_a_megabyte_is_read_in_one_pass(tmp_path):
    """A line cut short holding a megabyte of inner objects (a record's requests and sizes)
    is skipped without parsing it once per inner object (that took a minute)."""
    inner = ", ".join(json.dumps({"k": i, "v": [{"x": i}]}) for i in range(30000))
    path = tmp_path / "results.jsonl"
    ok = {**COMMON, "event": "result", "nodeid": "a", "task": "a", "verdict": "pass",
          "speedup": 1.0, "sizes": []}
    path.write_text(json.dumps(ok) + "\n" + '{"event": "result", "sizes": [' + inner + "\n")
    assert len(path.read_bytes()) > 1_000_000
    start = time.monotonic()
    assert [r["nodeid"] for r in load(path)] == ["a"]
    assert time.monotonic() - start < 20  # a minute before; milliseconds now


def test_an_empty_log_says_there_is_nothing_to_report(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    path.write_text("")
    assert main(["report", str(path)]) == 1
    assert "nothing to report" in capsys.readouterr().err


FULL_DISK_CONFTEST = """
import errno, os

_real = os.write
_failed = []


def _write(fd, data):
    # the first item's result line meets a full disk: half of it is written, then no room
    if not _failed and b'"event": "result"' in bytes(data) and b"ring_allreduce[np2]" in bytes(data):
        _failed.append(1)
        return _real(fd, bytes(data)[: len(data) // 2])
    return _real(fd, data)


os.write = _write
"""


def test_a_full_disk_at_a_result_line_loses_no_line_and_charges_no_item(bench):
    model = _faulty_then_healthy(bench, "pass")
    (bench.root / "conftest.py").write_text(FULL_DISK_CONFTEST)
    result = bench.run(f"--commbench-model=dir:{model}", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    log = _run_dir(bench) / "results.jsonl"
    raw = log.read_bytes().split(b"\n")
    assert raw[-1] == b"" and all(json.loads(line) for line in raw[:-1])  # no half line
    assert [(e["nodeid"], e["event"]) for e in entries(log)] == [
        (NODE, "started"), (NODE, "result"), (AFTER, "started"), (AFTER, "result")]
    report = bench.pytester.run(sys.executable, "-m", "pytest_commbench.cli", "report", str(log))
    report.stdout.fnmatch_lines(["Pass Rate 100.0% (2/2)*"])
    assert "aborted" not in report.stdout.str()


# -- one session per run folder ---------------------------------------------------------------

def test_the_run_lock_refuses_a_second_session_and_not_its_own_workers(tmp_path):
    run = tmp_path / "run"
    first = RunLock(run)
    first.hold()
    worker = RunLock(run)
    worker.join(wait_s=2)  # a worker of the first session is never refused
    with pytest.raises(RunBusy, match=f"pid {os.getpid()}"):
        RunLock(run).hold()
    first.release()
    # the controller is gone but a worker of its session still writes: still refused
    with pytest.raises(RunBusy, match="pytest-xdist workers of the pytest session of pid"):
        RunLock(run).hold()
    worker.release()
    again = RunLock(run)
    again.hold()
    again.release()


def _locked_by_someone(run: Path) -> bool:
    for name in ("session.lock", "workers.lock"):
        fd = os.open(run / name, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


@needs_sandbox
def test_a_second_resume_of_a_live_run_is_refused_naming_its_pid(bench):
    pytest.importorskip("xdist")
    bench.add_task()
    hang = bench.solution_dir("hang")
    model = f"--commbench-model=dir:{hang}"
    bench.run(model, "--commbench-timeout=2").assert_outcomes(failed=1)
    run = _run_dir(bench)
    log = run / "results.jsonl"
    # the run was killed before its item's result line
    log.write_text("".join(x + "\n" for x in log.read_text().splitlines()
                           if json.loads(x)["event"] != "result"))
    with open(bench.root / "first.log", "wb") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", model,
             f"--commbench-resume={run.name}", "--commbench-timeout=120", "-n", "1"],
            cwd=bench.root, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                sum(1 for e in entries(log) if e["event"] == "started") < 2:
            assert first.poll() is None, (bench.root / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        # its worker wrote the item's "started" line: the session's own worker is not refused
        assert sum(1 for e in entries(log) if e["event"] == "started") == 2
        before = log.read_bytes()
        second = bench.run(model, f"--commbench-resume={run.name}", "--commbench-timeout=2")
        assert second.ret == pytest.ExitCode.USAGE_ERROR, second.stdout.str()
        message = second.stderr.str()
        assert f"cannot be resumed now: it is in use by the pytest session of pid {first.pid}" \
            in message, message
        assert "Traceback" not in message
        assert log.read_bytes() == before  # the refused session touched nothing
    finally:
        first.terminate()
        first.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _locked_by_someone(run):
        time.sleep(0.2)
    third = bench.run(model, f"--commbench-resume={run.name}", "--commbench-timeout=2")
    third.assert_outcomes(failed=1)  # the first session is gone: the run is free again


# -- task files -------------------------------------------------------------------------------

def _task(tmp_path: Path) -> Path:
    suites = tmp_path / "suites"
    task = suites / "collective" / "ring_allreduce"
    shutil.copytree(REPO / "suites" / "collective" / "ring_allreduce", task)
    return task


def _set(manifest: Path, key: str, value: str) -> None:
    lines = [x for x in manifest.read_text().splitlines() if not x.startswith(f"{key} =")]
    # top-level keys go before the first table
    at = next(i for i, x in enumerate(lines) if x.startswith("["))
    manifest.write_text("\n".join([*lines[:at], f"{key} = {value}", *lines[at:]]) + "\n")


@pytest.mark.parametrize("key, value, message", [
    ("template", '"/etc/passwd"', "is an absolute path"),
    ("template", '"../ring_allreduce_copy/template.py"', "climbs out of the task's folder"),
    ("prompt", '"notes/../../../prompt.md"', "climbs out of the task's folder"),
    ("template", '"~/template.py"', "is an absolute path"),
    ("template", '"missing.py"', "does not exist beside the manifest"),
    ("sizes", f"[1, {2**31 + 1}]", "more than the 2147483648 (2^31) a size may have"),
    ("sizes", f"[{2**31}]", "GiB per buffer, more than 64 GiB"),
])
def test_a_manifest_naming_files_outside_its_folder_or_huge_sizes_is_refused(tmp_path, key,
                                                                             value, message):
    task = _task(tmp_path)
    shutil.copytree(task, task.parent / "ring_allreduce_copy")
    manifest = task / "task.toml"
    if key == "sizes":
        _set(manifest, "ranks", "[2, 8]")
    _set(manifest, key, value)
    with pytest.raises(ManifestError) as info:
        load_task(manifest, tmp_path / "suites")
    assert info.value.key == key and message in str(info.value), str(info.value)
    assert str(manifest) in str(info.value)


@pytest.mark.parametrize("key, value, message", [
    ("sizes", "[" + ", ".join(["1"] * 200000) + "]", "more than the 64 a task may have"),
    ("trials", "1000000000", "must be 1 to 64"),
    ("timeout", "1e300", "more than 86400 s"),
    ("ranks", "[2, 100000]", "at most 16 world sizes"),
    ("requires", "[" + ", ".join(['"x"'] * 1000) + "]", "more than 256"),
    ("params", "{ blob = \"" + "x" * 70000 + "\" }", "more than 65536"),
    ("<toml>", "[" * 5000 + "]" * 5000, "nested too deeply"),
])
def test_a_manifest_asking_for_unbounded_work_is_refused_before_any_item(tmp_path, key, value,
                                                                          message):
    """A hostile or mistyped manifest: 200,000 sizes, a billion trials, a timeout of 10^300
    s, arrays nested 5,000 deep (RecursionError before): one clear error naming the field."""
    task = _task(tmp_path)
    manifest = task / "task.toml"
    if key in ("trials", "params"):
        text = manifest.read_text()
        manifest.write_text(text.replace("[check]\n", f"[check]\n{key} = {value}\n", 1))
    elif key == "<toml>":
        manifest.write_text(manifest.read_text() + f"\ndeep = {value}\n")
    else:
        _set(manifest, key, value)
    with pytest.raises(ManifestError) as info:
        load_task(manifest, tmp_path / "suites")
    assert message in str(info.value), str(info.value)
    assert info.value.key.endswith(key), info.value.key


@pytest.mark.parametrize("name", ["template.py", "prompt.md"])
def test_a_task_file_linked_out_of_its_folder_is_refused(tmp_path, name):
    task = _task(tmp_path)
    secret = tmp_path / "references" / "solution.py"
    secret.parent.mkdir()
    secret.write_text("THE REFERENCE")
    (task / name).unlink()
    (task / name).symlink_to(secret)
    with pytest.raises(ManifestError) as info:
        load_task(task / "task.toml", tmp_path / "suites")
    key = "template" if name.startswith("template") else "prompt"
    assert info.value.key == key and "outside the task's folder" in str(info.value)
    # a link that stays inside the folder is fine
    (task / name).unlink()
    (task / f"real-{name}").write_text("# >>> COMMBENCH EDIT x\n# <<< COMMBENCH EDIT\n")
    (task / name).symlink_to(f"real-{name}")
    assert load_task(task / "task.toml", tmp_path / "suites").name == "ring_allreduce"


def test_a_template_linked_to_the_reference_is_a_collection_error_of_that_task(bench):
    bench.add_task()
    linked = bench.add_task(name="ring_allreduce_after")
    (linked / "template.py").unlink()
    (linked / "template.py").symlink_to(
        bench.root / "references" / "collective" / "ring_allreduce_after" / "solution.py")
    result = bench.run()
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines(["*ring_allreduce_after/task.toml: key 'template': *outside "
                                 "the task's folder*"])


# -- large output -----------------------------------------------------------------------------

def test_a_25_mb_write_is_drained_and_capped(tmp_path):
    code = ("import sys; sys.stdout.write('x' * 25_000_000 + 'END'); sys.stdout.flush(); "
            "sys.stderr.write('E' * 3_000_000 + 'LAST')")
    start = time.monotonic()
    result = run_job([sys.executable, "-c", code], tmp_path, 60)
    assert result.returncode == 0 and time.monotonic() - start < 30
    assert result.output.endswith("LAST") and "bytes cut" in result.output
    assert len(result.output) < launch.OUTPUT_CAP + 100
    kept = (tmp_path / "output.log").read_bytes()
    assert len(kept) < launch.LOG_HEAD + launch.OUTPUT_CAP + 200
    assert kept.startswith(b"x" * 1000) and kept.endswith(b"LAST") and b"not kept" in kept


def test_the_launcher_forwards_output_as_it_reads_it():
    exe = launch.find_mpiexec()
    if exe is None:
        pytest.skip("no mpiexec")
    argv = [exe, "-n", "2", sys.executable, "-m", "x"]
    options = launch.output_options()
    assert launch.drained(argv) == [exe, *options, *argv[1:]]
    assert launch.drained(["python", "-c", "pass"]) == ["python", "-c", "pass"]
    assert launch.drained([exe, "--output", "tag", "x"]) == [exe, "--output", "tag", "x"]
    if "Open MPI) 5" in launch.mpi_version():
        assert options == ("--output", ":raw")


@needs_sandbox
def test_a_correct_solution_printing_25_mb_in_one_write_passes(bench):
    bench.add_task()
    model = bench.root / "model" / "collective" / "ring_allreduce"
    model.mkdir(parents=True)
    (model / "solution.py").write_text(_solution("""
        global _printed
        try:
            _printed
        except NameError:
            _printed = True
            print("x" * 25_000_000 + "DONE", flush=True)
    """))
    start = time.monotonic()
    result = bench.run(f"--commbench-model=dir:{bench.root / 'model'}", "--commbench-keep")
    result.assert_outcomes(passed=1)
    (record,) = bench.records()
    assert record["verdict"] == "pass"
    assert "DONE" in record["output"] and len(record["output"]) <= 4000
    logs = list((_run_dir(bench) / "work").glob("*/*/output.log"))
    assert logs and all(p.stat().st_size < 1.2 * MiB for p in logs)
    print(f"25 MB in one write: passed in {time.monotonic() - start:.1f} s")


def test_a_task_folder_linked_in_from_elsewhere_keeps_the_category_it_is_linked_into(tmp_path):
    """suites/collective/ring_allreduce -> a folder outside the suite (a shared checkout of
    tasks): the task is collective/ring_allreduce, not a bare ring_allreduce."""
    elsewhere = tmp_path / "elsewhere" / "ring_allreduce"
    shutil.copytree(REPO / "suites" / "collective" / "ring_allreduce", elsewhere)
    linked = tmp_path / "suites" / "collective" / "ring_allreduce"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(elsewhere, target_is_directory=True)
    task = load_task(linked / "task.toml", tmp_path / "suites")
    assert task.relpath == "collective/ring_allreduce" and task.category == "collective"


@pytest.mark.parametrize("ext", [".py", ".cu", ".hip", ".cpp", ".c"])
def test_a_failing_items_folder_keeps_its_source_in_every_language(tmp_path, ext):
    """The solution's source is the first evidence a person reads, whatever its language (a
    HIP answer's .hip was deleted with the bulk); anything else the item left is removed."""
    from pytest_commbench.engine.tidy import tidy

    work = tmp_path / "item"
    (work / "j0" / "scratch").mkdir(parents=True)
    (work / f"solution{ext}").write_text("int x;\n")
    (work / "solution.so").write_bytes(b"\0" * 100)
    (work / "j0" / "output.log").write_text("out\n")
    (work / "j0" / "scratch" / "bulk.bin").write_bytes(b"x" * 1000)
    tidy(work, everything=False)
    kept = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert kept == ["j0/output.log", f"solution{ext}"]
