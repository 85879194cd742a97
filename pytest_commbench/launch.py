"""Start one MPI job in its own process session and make sure it is gone afterwards.

mpiexec puts every rank in a process group of its own, so killing mpiexec's group is not
enough: on a deadline we signal every process of the session (TERM, a grace period, KILL).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 3.0
POLL_S = 0.2
ABORT_GRACE_S = 5.0
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
OUTPUT_CAP = 64 * 1024


@dataclass
class JobResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    output: str  # stdout and stderr of all ranks, the tail kept within OUTPUT_CAP


def find_mpiexec() -> str | None:
    """mpiexec of the running Python's environment first, then the PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec") or shutil.which("mpirun")


@functools.lru_cache(maxsize=1)
def mpi_version() -> str:
    """First line of `mpiexec --version` (the controller never initializes MPI itself)."""
    exe = find_mpiexec()
    if exe is None:
        return "none"
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc.__class__.__name__})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


@functools.lru_cache(maxsize=1)
def mpi_abi() -> str | None:
    """The MPI ABI the ranks' mpi4py loads ("openmpi", "mpich"), from a child process that
    loads it without initializing MPI; None where mpi4py cannot tell (or is too old to ask)."""
    probe = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
             "from mpi4py import MPI\n"
             "text = MPI.Get_library_version()\n"
             "print('openmpi' if 'Open MPI' in text else 'mpich' if 'MPICH' in text or "
             "'Intel' in text else '')\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip()
    return found or None


SECRET = re.compile(r"(^COMMBENCH_)|(_API_KEY$)|(_KEY$)|(TOKEN)|(SECRET)|(PASSWORD)|(PASSWD)|"
                    r"(CREDENTIAL)|(^AWS_)|(^AZURE_)|(^GOOGLE_APPLICATION)", re.I)


def mpi_env() -> dict[str, str]:
    """The environment of a job: the controller's, less anything that is the benchmark's
    business (COMMBENCH_*: the seed among them) or looks like a credential (model API keys)."""
    env = {k: v for k, v in os.environ.items() if not SECRET.search(k)}
    # containers and CI run as root; Open MPI refuses without these
    # mpi4py (4.x, built for several MPI ABIs) picks its ABI by looking for MPI symbols in the
    # process first: the run-time guard's preload exports MPI names without Open MPI's data
    # symbols, which made it pick MPICH's (libmpi.so.12) under a task that forbids MPI_*;
    # the ABI is named instead (it is that of the MPI the launcher belongs to)
    abi = mpi_abi()
    if abi:
        env.setdefault("MPI4PY_MPIABI", abi)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is `sid` (Linux /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        # fields[0] is the state, fields[3] the session id
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def kill_session(sid: int, grace: float = GRACE_S) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and session_pids(sid):
            time.sleep(0.05)


def tail(path: Path, cap: int = OUTPUT_CAP) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size > cap:
                f.seek(size - cap)
            data = f.read()
    except OSError:
        return ""
    # Open MPI writes NUL bytes when a rank aborts; keep the text printable for reports
    text = CONTROL.sub("", data.decode(errors="replace"))
    if size > cap:
        text = f"[... {size - cap} bytes cut ...]\n" + text
    return text


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The job gets SIGKILL when the controller dies (kill -9 of pytest or of a worker):
    with the sandbox this ends the job's PID namespace and everything in it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# the jobs this process has started and not yet finished (the stop handler ends them)
LIVE: dict[int, Job] = {}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def end_live_jobs() -> None:
    """Kill every job this process started and has not finished, and wait until their
    processes are gone (a sandboxed job's namespace with them)."""
    for job in list(LIVE.values()):
        try:
            kill_session(job.proc.pid, grace=1.0)
            job.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - the next job still gets its kill
            pass
        LIVE.pop(job.proc.pid, None)


def _stop(signum: int, _frame) -> None:
    """SIGTERM/SIGHUP to the controller (a CI job cancelled, a scheduler's time limit): its
    jobs go first, then the controller dies of the same signal, as it would have."""
    end_live_jobs()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_stop_handlers() -> None:
    """In the main thread of a controller (pytest, an xdist worker): a job never outlives it.
    SIGINT is pytest's (KeyboardInterrupt runs every job's `finish`); SIGKILL leaves only the
    parent-death signal, which ends the job's sandbox."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _stop)


class Job:
    """A started job: its own process session, output to a log, a deadline, a kill that leaves
    nothing behind."""

    def __init__(self, argv: list[str], cwd: Path, deadline_s: float,
                 env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.log = log or (cwd / "output.log")
        self.start = time.monotonic()
        self.end = self.start + deadline_s
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        LIVE[self.proc.pid] = self
        self.timed_out = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def overdue(self) -> bool:
        return time.monotonic() >= self.end

    def wait(self, failed: Callable[[], bool] | None = None) -> None:
        """Until the job ends or its deadline passes; `failed` is polled meanwhile: once it
        says a rank has reported an error, the job gets ABORT_GRACE_S to end by itself
        (MPI_Abort can hang on a corrupted heap) and is then killed."""
        aborting = False
        while True:
            try:
                self.proc.wait(timeout=POLL_S)
                return
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= self.end:
                self.timed_out = not aborting  # a hung abort is the rank's error, not a timeout
                return
            if not aborting and failed is not None and self.end > now + ABORT_GRACE_S \
                    and failed():
                self.end, aborting = now + ABORT_GRACE_S, True

    def finish(self) -> JobResult:
        """Kill whatever is left of the job and collect its result."""
        kill_session(self.proc.pid)  # also reaps ranks left behind by a job that did exit
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - KILL cannot be ignored
            pass
        LIVE.pop(self.proc.pid, None)
        self._out.close()
        code = self.proc.returncode
        return JobResult(None if self.timed_out or code is None else code, self.timed_out,
                         time.monotonic() - self.start, tail(self.log))


def run_job(argv: list[str], cwd: Path, deadline_s: float, env: dict[str, str] | None = None,
            log: Path | None = None, failed: Callable[[], bool] | None = None) -> JobResult:
    """Run argv with a wall-clock deadline; whatever happens, nothing of it survives."""
    job = Job(argv, cwd, deadline_s, env=env, log=log)
    try:
        job.wait(failed)
    finally:
        result = job.finish()
    return result
