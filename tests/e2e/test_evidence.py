"""Verdicts from evidence the solution cannot produce, and a job's files read safely.

1. An exit code, a file or a message a rank can make never decides `infra_error`: a rank
   that ends with the harness's own codes after loading (87: the guard does not fit the MPI,
   125: the sandbox could not be built, 124: the MPS daemon did not start) is the solution's
   `runtime_error`; so is a rank that kills its launcher or signals the job's namespace init.
   A job killed from outside (its `unshare`, the controller's own child, dies of a signal
   the controller did not send) is the harness's. Whether a rank began to load the solution
   is read from everything the ranks said, not only what the observer had read. A rank whose
   abort hangs after it raised is a timeout that says the exception.
2. The controller reads a job's files (guard reports, status and stack files, the output log)
   without following links, never waiting on a FIFO, only regular files, at most a cap.
3. Small ones: a reply that begins with a UTF-8 BOM, a runs folder that cannot be written,
   the text of an exception a Python solution raised.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pytest_commbench import checks, interposer, jobfiles, launch, observer, regions
from pytest_commbench.engine import blame as engine_blame
from pytest_commbench.engine.plan import InfraError, Outcome
from pytest_commbench.launch import JobResult
from pytest_commbench.rank.protocol import socket_address
from pytest_commbench.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
TASK_DIR = "collective/ring_allreduce"
TEMPLATE = REPO / "suites" / TASK_DIR / "template.py"
RIGHT = REPO / "fixtures" / "solutions" / "right_naive" / TASK_DIR / "solution.py"
SECRET = "TOPSECRET-7f3a9c"


def _solution(body: str) -> str:
    """The task's template with `body` (lines at the region's indent) as its region."""
    template = TEMPLATE.read_text()
    begin = template.index("# >>> COMMBENCH EDIT allreduce")
    end = template.index("# <<< COMMBENCH EDIT", begin)
    lines = "".join(f"    {line}\n" if line else "\n" for line in body.strip("\n").splitlines())
    return template[:begin] + "# >>> COMMBENCH EDIT allreduce\n" + lines + "    " + template[end:]


def _replies(root: Path, text: str | bytes) -> Path:
    folder = root / "replies" / TASK_DIR
    folder.mkdir(parents=True)
    data = text.encode() if isinstance(text, str) else text
    (folder / "solution.py").write_bytes(data)
    return root / "replies"


def _run(bench, *args: str, timeout: float = 300):
    """`bench.run` with a limit: a session that hangs fails the test instead of the suite."""
    return bench.pytester.runpytest_subprocess("suites", "-p", "no:cacheprovider", *args,
                                               timeout=timeout)


def _record(bench) -> dict:
    (record,) = bench.records()
    return record


# -- 1. verdicts from evidence -------------------------------------------------------------------

@pytest.mark.parametrize("code", [87, 125, 124])
def test_a_harness_exit_code_after_loading_is_the_solutions_failure(bench, code):
    bench.add_task()
    replies = _replies(bench.root, _solution(f"import os\nos._exit({code})\n"))
    bench.run(f"--commbench-model=dir:{replies}").assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] == "runtime_error", record


@pytest.mark.parametrize("body", [
    # the launcher, the namespace init (which passes a SIGTERM on to the launcher), the
    # launcher's process group, every process of the job the rank may signal
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import os, signal\nos.kill(1, signal.SIGTERM)",
    "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGINT)",
    "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
    "import os, signal\nos.kill(-1, signal.SIGKILL)",
], ids=["launcher", "init-term", "init-kill-int", "launcher-group", "everything"])
def test_a_rank_that_signals_what_it_can_reach_is_the_solutions_failure(bench, body):
    bench.add_task()
    replies = _replies(bench.root, _solution(body + "\nimport time\ntime.sleep(60)\n"))
    _run(bench, f"--commbench-model=dir:{replies}", "--commbench-timeout=30",
         timeout=180).assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] in ("runtime_error", "timeout"), record


def _unshare_of(job_dir: bytes) -> list[int]:
    """Pids of the `unshare` processes whose command line names the job folder."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"unshare" and \
                any(job_dir in a for a in argv):
            found.append(int(entry))
    return found


def test_a_job_killed_from_outside_is_the_harnesss_failure(bench):
    from pytest_commbench import sandbox

    if sandbox.probe():
        pytest.skip(f"no job sandbox here: {sandbox.probe()}")
    bench.add_task()
    replies = _replies(bench.root, _solution(
        "import pathlib, time\n"
        "pathlib.Path(ctx.scratch, 'loaded').write_text('yes')\n"
        "time.sleep(60)\n"))
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(
        result=_run(bench, f"--commbench-model=dir:{replies}", timeout=240)))
    thread.start()
    killed: set[int] = set()
    try:
        # every attempt's job (an infra_error is tried again), once its solution is loaded
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and thread.is_alive():
            for mark in (bench.root / "runs").glob("*/work/*/*/scratch/r*/loaded"):
                for pid in set(_unshare_of(str(mark.parent.parent.parent).encode())) - killed:
                    os.kill(pid, signal.SIGKILL)  # from outside the job: not the controller
                    killed.add(pid)
            time.sleep(0.05)
    finally:
        thread.join(240)
    assert killed, "the solution never said it was loaded"
    done["result"].assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] == "infra_error", record
    assert "killed from outside" in record["message"]


def test_no_process_of_a_job_shares_a_process_group_with_its_unshare(tmp_path):
    """What makes `unshare`'s death by signal evidence from outside: the launcher (and all it
    starts) runs in a session of its own, so kill(0, ...) inside never reaches `unshare`."""
    from pytest_commbench import sandbox

    if sandbox.probe():
        pytest.skip(f"no job sandbox here: {sandbox.probe()}")
    job = tmp_path / "job"
    (job / "ro").mkdir(parents=True)
    show = "import os; print(os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid())"
    argv = sandbox.wrap(job, [sys.executable, "-I", "-S", "-c", show],
                        {"PATH": "/usr/bin:/bin"}, hide=[])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def test_the_evidence_of_an_outside_kill_is_the_controllers_own_record():
    def result(code, killed):
        return JobResult(code, False, 1.0, "", killed)

    with pytest.raises(InfraError, match="killed from outside"):
        engine_blame.killed_outside(result(-9, killed=False))
    engine_blame.killed_outside(result(-9, killed=True))  # the controller's own kill
    engine_blame.killed_outside(result(137, killed=False))  # the namespace's init reported it
    engine_blame.killed_outside(result(None, killed=False))


class _Job:
    """What the observer asks of a job while ranks connect."""

    timed_out = False

    def overdue(self) -> bool:
        return False

    def alive(self) -> bool:
        return True


def test_a_ranks_loading_word_is_read_even_when_the_observer_never_looked(tmp_path):
    """`loaded` decides who is to blame: a rank that said "loading" and died before the
    observer read its socket is still known to have loaded (`settle`)."""
    obs = observer.Observer(
        tmp_path, 1, checks.get("allreduce"),
        observer.Settings(reps=1, max_reps=1, timing_budget=0, warmup=0, wall_s=1, rtol=0, atol=0),
        np.random.default_rng(0), staged=False, timed=False)

    def rank() -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = socket_address(str(tmp_path))
        try:
            sock.connect(address)
        finally:
            os.close(fd)
        sock.sendall(b'{"rank": 0, "pid": 1}\n')
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 5)
        for f in fds:
            os.close(f)
        sock.sendall(b'{"phase": "loading"}\n' + b"x" * 200_000)  # then the solution's noise
        sock.close()

    thread = threading.Thread(target=rank)
    thread.start()
    try:
        obs.connect(_Job())
        thread.join(30)
        assert not obs.loaded  # nothing was read after the hello yet
        obs.settle()
        assert obs.loaded
    finally:
        obs.close()


def _timeout_outcome() -> Outcome:
    return Outcome(Verdict.TIMEOUT, "the job did not finish within 8 s and was killed")


def test_a_hung_abort_reports_the_exception_and_stays_a_timeout(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "status_r1.json").write_text(json.dumps({
        "phase": "case c0", "error": "ValueError: the exception that tells",
        "traceback": "Traceback (most recent call last):\nValueError: the exception that tells"}))
    outcome = _timeout_outcome()
    engine_blame.blame(outcome, JobResult(None, True, 8.0, ""), out, 2, loaded=True)
    assert outcome.verdict is Verdict.TIMEOUT
    assert "rank 1 had raised" in outcome.message
    assert "ValueError: the exception that tells" in outcome.message
    assert "Traceback" in outcome.detail


def test_a_rank_whose_abort_hangs_is_a_timeout_that_says_its_exception(bench):
    bench.add_task()
    # a stopped launcher: the rank's MPI_Abort waits for it until the job's deadline
    replies = _replies(bench.root, _solution(
        "import os, signal, time\n"
        "if ctx.rank == 0:\n"
        "    os.kill(os.getppid(), signal.SIGSTOP)\n"
        "    raise ValueError('the exception that tells')\n"
        "time.sleep(60)\n"))
    _run(bench, f"--commbench-model=dir:{replies}", "--commbench-timeout=8",
         timeout=180).assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] in ("timeout", "runtime_error"), record
    assert "ValueError: the exception that tells" in record["message"], record


def test_before_loading_even_a_guard_report_is_the_harnesss_failure(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "guard_r0.json").write_text('{"forbidden": "MPI_Allreduce"}\n')
    outcome = Outcome(Verdict.RUNTIME_ERROR, "the job ended early")
    with pytest.raises(InfraError, match="before the solution was loaded"):
        engine_blame.blame(outcome, JobResult(1, False, 1.0, ""), out, 1, loaded=False)
    engine_blame.blame(outcome, JobResult(86, False, 1.0, ""), out, 1, loaded=True)
    assert outcome.verdict is Verdict.FORBIDDEN


# -- 2. a job's files, read safely ----------------------------------------------------------------

def _returns_within(seconds: float, fifos: list[Path], fn, *args):
    """fn(*args), which must return within `seconds` (a reader blocked on one of `fifos` is
    released before the test fails)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:  # a writer lets a blocked open() return
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(5)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on a FIFO the job planted")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def job_dir(tmp_path) -> Path:
    job = tmp_path / "job"
    (job / "out").mkdir(parents=True)
    return job


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "hidden" / "solution.py"
    path.parent.mkdir()
    path.write_text(f'"""the reference"""\n# {SECRET}\n' + json.dumps({"phase": SECRET}))
    return path


def _fifos(job: Path, world: int = 2) -> list[Path]:
    names = [f"out/{kind}_r{r}.{ext}" for r in range(world)
             for kind, ext in (("guard", "json"), ("status", "json"), ("stack", "txt"))]
    paths = [job / n for n in names] + [job / "output.log"]
    for path in paths:
        os.mkfifo(path)
    return paths


@pytest.mark.parametrize("verdict", [Verdict.TIMEOUT, Verdict.RUNTIME_ERROR])
def test_fifos_planted_in_a_job_folder_never_block_the_controller(job_dir, verdict):
    fifos = _fifos(job_dir)
    outcome = Outcome(verdict, "the job ended early")
    _returns_within(10, fifos, engine_blame.blame, outcome, JobResult(1, False, 1.0, ""),
                    job_dir / "out", 2, True)
    assert outcome.verdict is verdict
    assert _returns_within(10, fifos, observer.guard_reports, job_dir / "out", 2) == []
    assert _returns_within(10, fifos, interposer.guard_report,
                           job_dir / "out" / "guard_r0.json") is None
    assert _returns_within(10, fifos, launch.tail, job_dir / "output.log") == ""
    assert _returns_within(10, fifos, engine_blame.stacks, job_dir / "out", 2) == ""


def test_links_planted_in_a_job_folder_are_never_followed(job_dir, secret):
    out = job_dir / "out"
    for name in ("guard_r0.json", "status_r0.json", "stack_r0.txt"):
        (out / name).symlink_to(secret)
    (job_dir / "output.log").symlink_to(secret)
    outcome = _timeout_outcome()
    engine_blame.blame(outcome, JobResult(None, True, 8.0, ""), out, 1, loaded=True)
    assert outcome.verdict is Verdict.TIMEOUT
    assert SECRET not in outcome.message + outcome.detail
    assert observer.guard_reports(out, 1) == []
    assert interposer.guard_report(out / "guard_r0.json") is None
    assert SECRET not in launch.tail(job_dir / "output.log")
    assert SECRET not in engine_blame.stacks(out, 1)


def test_a_linked_out_folder_is_never_entered(job_dir, secret):
    """`out` itself replaced with a link to a folder of the job's choosing."""
    elsewhere = secret.parent
    (elsewhere / "stack_r0.txt").write_text(SECRET)
    (elsewhere / "guard_r0.json").write_text(json.dumps({"forbidden": SECRET}))
    shutil.rmtree(job_dir / "out")
    (job_dir / "out").symlink_to(elsewhere)
    assert engine_blame.stacks(job_dir / "out", 1) == ""
    assert observer.guard_reports(job_dir / "out", 1) == []
    assert jobfiles.read(job_dir, "out/stack_r0.txt") is None


def test_a_job_file_is_read_no_further_than_its_cap(job_dir):
    with open(job_dir / "out" / "stack_r0.txt", "wb") as f:
        f.truncate(64 << 20)
    assert len(jobfiles.read(job_dir, "out/stack_r0.txt", 4096)) == 4096
    assert len(engine_blame.stacks(job_dir / "out", 1)) < 4000
    text = launch.tail(job_dir / "out" / "stack_r0.txt", 1000)
    assert text.startswith(f"[... {(64 << 20) - 1000} bytes cut ...]")


def test_the_log_is_read_from_the_controllers_own_descriptor(job_dir, secret):
    """The name `output.log` replaced with a link (or a FIFO) after the controller opened it:
    read through its own descriptor, the log is the file it wrote."""
    log = job_dir / "output.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, b"what the ranks printed\n")
        log.unlink()
        log.symlink_to(secret)
        text = launch.tail(fd)
        assert "what the ranks printed" in text and SECRET not in text
        log.unlink()
        os.mkfifo(log)
        assert "what the ranks printed" in _returns_within(10, [log], launch.tail, fd)
    finally:
        os.close(fd)


def test_job_file_names_are_the_controllers_own():
    for name in ("../x", "out/../../x", "/etc/passwd", "out//x", "./x"):
        with pytest.raises(ValueError):
            jobfiles.read("/tmp", name)


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_what_a_hung_job_plants_in_its_folder_is_never_followed_nor_waited_on(bench, plant):
    """End to end: while the solution hangs, its rank status, stack and guard files and the
    output log are replaced with links to a secret file of the host, or with FIFOs (what a
    compiled solution can do; a Python one is refused both). The timeout's record, its
    detail read from those files, holds no secret, and the session ends."""
    bench.add_task()
    secret = bench.root / "secret.py"
    secret.write_text(f"# {SECRET}\n")
    replies = _replies(bench.root, _solution(
        "import pathlib, time\n"
        "pathlib.Path(ctx.scratch, 'loaded').write_text('yes')\n"
        "time.sleep(60)\n"))
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(result=_run(
        bench, f"--commbench-model=dir:{replies}", "--commbench-timeout=8", timeout=180)))
    thread.start()
    planted: set[Path] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and thread.is_alive() and not planted:
            for mark in (bench.root / "runs").glob("*/work/*/*/scratch/r*/loaded"):
                job = mark.parent.parent.parent
                for name in ("out/stack_r0.txt", "out/stack_r1.txt", "out/status_r0.json",
                             "out/status_r1.json", "out/guard_r0.json", "output.log"):
                    path = job / name
                    path.unlink(missing_ok=True)
                    if plant == "link":
                        path.symlink_to(secret)
                    else:
                        os.mkfifo(path)
                    planted.add(path)
                break
            time.sleep(0.05)
    finally:
        thread.join(200)
    assert planted, "the solution never said it was loaded"
    done["result"].assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] == "timeout", record
    assert SECRET not in json.dumps(record)


def test_a_python_solution_that_plants_fifos_never_hangs_the_session(bench):
    bench.add_task()
    replies = _replies(bench.root, _solution(
        "import os\n"
        "out = os.path.join(os.path.dirname(os.path.dirname(str(ctx.scratch))), 'out')\n"
        "for name in ('guard_r{}.json', 'stack_r{}.txt'):\n"
        "    path = os.path.join(out, name.format(ctx.rank))\n"
        "    if not os.path.exists(path):\n"
        "        os.mkfifo(path)\n"
        "raise ValueError('after planting')\n"))
    result = _run(bench, f"--commbench-model=dir:{replies}", timeout=180)
    result.assert_outcomes(failed=1)
    assert _record(bench)["verdict"] in ("runtime_error", "forbidden")


# -- 3. small ones --------------------------------------------------------------------------------

def test_a_reply_that_begins_with_a_bom_is_the_reply_without_it():
    template = TEMPLATE.read_text()
    solution = RIGHT.read_text()
    assert regions.merge_reply(template, "\ufeff" + solution) == solution


def test_a_reply_file_that_begins_with_a_bom_passes(bench):
    bench.add_task()
    replies = _replies(bench.root, b"\xef\xbb\xbf" + RIGHT.read_bytes())
    bench.run(f"--commbench-model=dir:{replies}").assert_outcomes(passed=1)
    assert _record(bench)["verdict"] == "pass"


def _read_only_bind(bench, runs: Path) -> subprocess.CompletedProcess:
    """pytest in a mount namespace where `runs` is a read-only bind of itself (read-only for
    root as well)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    script = (f'mount --bind "{runs}" "{runs}" && mount -o remount,bind,ro "{runs}" || exit 99\n'
              f'exec "{sys.executable}" -m pytest suites -p no:cacheprovider '
              "--commbench-model=reference\n")
    done = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script],
                          cwd=bench.root, capture_output=True, text=True, timeout=300)
    if done.returncode == 99:
        pytest.skip(f"no read-only bind mount here: {done.stderr.strip()[-300:]}")
    return done


def test_a_read_only_runs_folder_is_a_usage_error_before_any_item_runs(bench):
    bench.add_task()
    runs = bench.root / "runs"
    runs.mkdir()
    done = _read_only_bind(bench, runs)
    text = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, text
    assert "INTERNALERROR" not in text
    assert "cannot be written" in text and str(runs) in text
    assert list(runs.iterdir()) == []


def test_a_runs_folder_that_cannot_be_made_is_a_usage_error(bench):
    bench.add_task()
    blocked = bench.root / "a-file"
    blocked.write_text("not a folder")
    result = _run(bench, "-o", f"commbench_runs_dir={blocked / 'runs'}",
                  "--commbench-model=reference")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text and "cannot be written" in text
    bench.run("--collect-only").assert_outcomes()  # the check leaves nothing behind
    assert not (bench.root / "runs").exists()
    assert not list(bench.root.glob(".commbench-probe-*"))


def test_the_text_of_a_solutions_exception_is_kept(bench):
    bench.add_task()
    replies = _replies(bench.root, _solution(
        "errors = np._core._exceptions if hasattr(np, '_core') else np.core._exceptions\n"
        "raise errors._ArrayMemoryError((1 << 40,), np.dtype('float64'))\n"))
    bench.run(f"--commbench-model=dir:{replies}").assert_outcomes(failed=1)
    record = _record(bench)
    assert record["verdict"] == "runtime_error", record
    # numpy's own words, made from the shape and dtype without calling its method
    assert ("MemoryError: Unable to allocate 8.0 TiB for an array with shape (1099511627776,) "
            "and data type float64") in record["message"], record["message"]
