"""Start one MPI job in its own process session and make sure it is gone afterwards.

mpiexec puts every rank in a process group of its own, so killing mpiexec's group is not
enough: on a deadline we signal every process of the session (TERM, a grace period, KILL).

A job's output (the launcher's stdout and stderr, which carry the ranks') goes into a pipe
that a thread of the controller drains as fast as it comes: the first `LOG_HEAD` bytes are
written to the job's `output.log` as they arrive, the last `OUTPUT_CAP` bytes are kept in
memory (and appended to the log when the job ends), and what lies between is counted and
dropped. A job that prints gigabytes neither fills the disk nor waits for the controller,
and its result carries the tail of its output, read from memory, never from a file the job
could have replaced. The launcher forwards the ranks' output as it reads it
(`output_options`): Open MPI 5's launcher otherwise assembles each line of a rank's output
before writing it, copying the whole line again at every read, so one 25 MB write without a
newline took it minutes and the job was killed as "did not end cleanly".
"""

from __future__ import annotations

import functools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import jobfiles

GRACE_S = 3.0
POLL_S = 0.2
ABORT_GRACE_S = 5.0
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
OUTPUT_CAP = 64 * 1024
LOG_HEAD = 1 << 20  # bytes of a job's output written to its log as they come
READ_CHUNK = 1 << 20
DRAIN_S = 5.0  # after the job ended, how long its output may still take to come out


@dataclass
class JobResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    output: str  # stdout and stderr of all ranks, the tail kept within OUTPUT_CAP
    # the controller's own record: the job's first process was still running when `finish`
    # signalled the job (a death by signal is then the controller's doing)
    killed: bool = False


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


#: a batch system's allocation, where a launcher may place ranks on other nodes
ALLOCATION_ENV = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")
#: Open MPI's transports between ranks of one node: itself and shared memory ("vader" is
#: Open MPI 4's name of its shared-memory BTL and Open MPI 5's alias of "sm")
SINGLE_NODE_BTL = "self,vader"


def single_node_transports(environ: dict[str, str]) -> dict[str, str]:
    """Open MPI's shared-memory transport alone for a job on this node: without it every
    job's start probes the network transports (TCP, OFI, UCT), about 1 s of each job's start
    on a machine with no fabric, and a job of ranks on one node uses shared memory anyway.
    Nothing is set where the user chose the transports or a batch system's allocation may
    put ranks on other nodes."""
    if "OMPI_MCA_btl" in environ or any(k in environ for k in ALLOCATION_ENV):
        return {}
    return {"OMPI_MCA_btl": SINGLE_NODE_BTL}


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
    env.update(single_node_transports(env))
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command's name) of every process
    (fields[0] is the state, fields[1] the parent, fields[3] the session id)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3:
            yield int(entry), fields


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is `sid` (Linux /proc)."""
    return [pid for pid, fields in proc_stats() if int(fields[3]) == sid and fields[0] != "Z"]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [child for child, fields in proc_stats() if int(fields[1]) == pid]


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


def tail(source: Path | int, cap: int = OUTPUT_CAP) -> str:
    """The last `cap` bytes of a job's output log as printable text, saying how much was cut.
    `source` is the controller's own descriptor of the log (reopened read-only: the file it
    wrote, whatever the job did to the name since) or the log's path, read as `jobfiles`
    reads a job's files (its folder the controller's own, the name never followed, only a
    regular file, a FIFO never waited on); "" where there is no such file."""
    if isinstance(source, int):
        fd = jobfiles.reopen(source)
    else:
        fd = jobfiles.open_file(Path(source).parent, Path(source).name)
    if fd is None:
        return ""
    try:
        data, size = jobfiles.read_fd(fd, cap, tail=True)
    except OSError:
        return ""
    finally:
        os.close(fd)
    # Open MPI writes NUL bytes when a rank aborts; keep the text printable for reports
    text = CONTROL.sub("", data.decode(errors="replace"))
    if size > cap:
        text = f"[... {size - cap} bytes cut ...]\n" + text
    return text


@functools.lru_cache(maxsize=1)
def output_options() -> tuple[str, ...]:
    """The launcher options that make it forward the ranks' output as it reads it: Open MPI
    5 (PRRTE) otherwise buffers a rank's output into whole lines, growing the line by a
    copy at each 4 KB read (one 16 MB line took it a minute, 4 MB 4 s, 2 MB 1 s: quadratic),
    which stalls a job whose solution prints a long line. Lines of different ranks may then
    interleave mid-line in the output (it is only quoted for a human). None for other
    launchers (Open MPI 4's and MPICH's have no such option)."""
    version = mpi_version()
    major = re.search(r"\((?:Open MPI|PRRTE|PRTE)\)\s+(\d+)", version)
    if major and ("Open MPI" not in version or int(major.group(1)) >= 5):
        return ("--output", ":raw")
    return ()


def drained(argv: list[str]) -> list[str]:
    """`argv` with the launcher's output options (`output_options`) after the launcher
    (the `find_mpiexec()` program wherever it stands: first, or after a wrapper); as it was
    when no launcher is in it or it names its own `--output`."""
    options = output_options()
    exe = find_mpiexec()
    if not options or exe is None or exe not in argv:
        return list(argv)
    at = argv.index(exe) + 1
    if any(a == "--output" or a.startswith("--output=") for a in argv[at:]):
        return list(argv)
    return [*argv[:at], *options, *argv[at:]]


class OutputDrain:
    """Reads a job's output pipe until it ends: the first `head` bytes into `log` as they
    come, the last `cap` bytes kept in memory, the rest counted. A thread of its own, so a
    job that prints never blocks on a full pipe while the controller is busy."""

    def __init__(self, fd: int, log, head: int = LOG_HEAD, cap: int = OUTPUT_CAP) -> None:
        self.fd, self.log, self.head, self.cap = fd, log, head, cap
        self.total = 0  # bytes the job wrote
        self.written = 0  # bytes of them in the log
        self.last = bytearray()  # the last `cap` bytes
        self.failed: str | None = None  # why the log could not be written (a full disk)
        self._stop_at: float | None = None
        os.set_blocking(fd, False)
        self.thread = threading.Thread(target=self._run, name="commbench-output", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], POLL_S)
                if not ready:
                    if self._stop_at is not None:
                        return  # the job is over and nothing more comes
                    continue
                try:
                    data = os.read(self.fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    return  # every writer is gone
                self._take(data)
                if self._stop_at is not None and time.monotonic() > self._stop_at:
                    return  # something outside the job holds the pipe and keeps writing
        except (OSError, ValueError):  # the descriptor went away: nothing more to read
            return

    def _take(self, data: bytes) -> None:
        self.total += len(data)
        if self.written < self.head and self.failed is None:
            part = data[:self.head - self.written]
            try:
                self.log.write(part)
                self.log.flush()
                self.written += len(part)
            except (OSError, ValueError) as exc:
                self.failed = f"{exc.__class__.__name__}: {exc}"
        self.last += data
        if len(self.last) > self.cap:
            del self.last[:len(self.last) - self.cap]

    def finish(self, grace: float = DRAIN_S) -> None:
        """Read what is still in the pipe (at most `grace` seconds), then append the tail
        that the log's head does not hold, saying how much lies between."""
        self._stop_at = time.monotonic() + grace
        self.thread.join(grace + 2 * POLL_S)
        try:
            os.close(self.fd)
        except OSError:
            pass
        missing = self.total - self.written  # bytes of the output not in the log
        if missing <= 0 or self.failed is not None:
            return
        tail = bytes(self.last[-missing:]) if missing <= len(self.last) else bytes(self.last)
        note = b"" if missing <= len(self.last) else \
            f"\n[... {missing - len(tail)} bytes of output not kept ...]\n".encode()
        try:
            self.log.write(note + tail)
            self.log.flush()
        except (OSError, ValueError) as exc:
            self.failed = f"{exc.__class__.__name__}: {exc}"

    def text(self) -> str:
        """The tail of the output as `tail()` gives a file's: printable, saying what was cut."""
        data = bytes(self.last[-self.cap:])
        text = CONTROL.sub("", data.decode(errors="replace"))
        if self.total > len(data):
            text = f"[... {self.total - len(data)} bytes cut ...]\n" + text
        return text


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:  # pragma: no cover - in the child
    """The job gets SIGKILL when the controller dies (kill -9 of pytest or of a worker):
    with the sandbox this ends the job's PID namespace and everything in it. `parent`: the
    controller's pid, taken before the fork; a controller that died before the signal was
    set (it never fires then) ends the child here."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


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


# set by SIGINT: the run stops after the item it is in, even where the KeyboardInterrupt the
# signal raised was swallowed (raised inside a destructor, say an SDK client's __del__, it is
# only printed)
INTERRUPTED = [False]


def _interrupt(signum: int, frame) -> None:
    INTERRUPTED[0] = True
    signal.default_int_handler(signum, frame)


def install_stop_handlers() -> None:
    """In the main thread of a controller (pytest, an xdist worker): a job never outlives it.
    SIGINT is pytest's (KeyboardInterrupt runs every job's `finish`), noted in `INTERRUPTED`
    as well (the plugin stops the run after the item where it came); SIGKILL leaves only the
    parent-death signal, which ends the job's sandbox."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


class Job:
    """A started job: its own process session, output to a log, a deadline, a kill that leaves
    nothing behind."""

    def __init__(self, argv: list[str], cwd: Path, deadline_s: float,
                 env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.log = log or (cwd / "output.log")
        self.start = time.monotonic()
        self.end = self.start + deadline_s
        # a fresh file of the controller's own (a link planted at its name is replaced)
        self.log.unlink(missing_ok=True)
        self._out = open(os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o644), "wb")
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(drained(argv), cwd=cwd, env=env, stdout=write_end,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         preexec_fn=functools.partial(die_with_parent,
                                                                      os.getpid()))
        except BaseException:
            os.close(read_end)
            self._out.close()
            raise
        finally:
            os.close(write_end)  # the job holds it now: the pipe ends when the job does
        self.output = OutputDrain(read_end, self._out)
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
        killed = self.proc.poll() is None
        kill_session(self.proc.pid)  # also reaps ranks left behind by a job that did exit
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - KILL cannot be ignored
            pass
        LIVE.pop(self.proc.pid, None)
        self.output.finish()
        self._out.close()
        code = self.proc.returncode
        return JobResult(None if self.timed_out or code is None else code, self.timed_out,
                         time.monotonic() - self.start, self.output.text(), killed)


def run_job(argv: list[str], cwd: Path, deadline_s: float, env: dict[str, str] | None = None,
            log: Path | None = None, failed: Callable[[], bool] | None = None) -> JobResult:
    """Run argv with a wall-clock deadline; whatever happens, nothing of it survives."""
    job = Job(argv, cwd, deadline_s, env=env, log=log)
    try:
        job.wait(failed)
    finally:
        result = job.finish()
    return result
