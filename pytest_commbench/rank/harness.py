"""The per-rank driver: `python -m commbench_rank JOB.json` under mpiexec, in the sandbox.

Nothing here decides a verdict and nothing it reports after the solution is loaded is
believed: the observer (controller side) writes the inputs, opens the gate of every call,
takes the time when the rank says it is done and reads the outputs itself. This code only
sets up the world, loads the solution and calls it when told to. It imports nothing from the
controller (the package is not even visible in the sandbox); the control page and data
segment are described in `protocol.py`.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import select
import socket
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from .backends import make_backend
from .protocol import (
    BATCH_SEP,
    ENV_GUARD_REPORT,
    GUARD_EXIT,
    NATIVE_LANGUAGES,
    Control,
    JobSpec,
    W,
    batch_sets,
    guard_file,
    on_this_host,
    read_feed,
    socket_address,
    stack_file,
    status_file,
    views,
)

PR_SET_DUMPABLE = 4
# once the audit hook is installed, the only safe way to format an exception (reading
# frames otherwise trips the hook); replaced by guard()
DESCRIBE = [lambda exc: traceback.format_exc()[-6000:]]
SPIN_S = 200e-6  # a wait spins this long before it sleeps until the observer's wake-up call


class Status:
    """A small JSON file per rank with how far the rank got and its error, if any. Only
    quoted in messages: the controller never decides anything from it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"phase": "start", "pid": os.getpid()}

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)
        except OSError:
            pass


class Context(SimpleNamespace):
    """What the solution is handed as its first argument.

    comm        an mpi4py communicator of all ranks, for the solution alone
    rank        this rank's index; world_size: number of ranks
    hostname    the host this rank is on (the harness may present virtual hosts)
    params      the task's scalar parameters (also passed by name where the entry asks)
    scratch     a directory the solution may write to
    GPU tasks also: device, local_rank, stream (a cupy stream), nccl (a cupy NCCL
    communicator where the task asks for one); torch tasks: group (torch.distributed's group of
    all ranks, NCCL) and torch_stream (the same stream as a torch stream), and their buffers
    come as torch tensors
    """


class Link:
    """The rank's connection to the observer: who it is, its control page and data segment."""

    def __init__(self, path: str, rank: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = socket_address(path)
        try:
            self.sock.connect(address)
        finally:
            os.close(fd)
        # its host: where the launcher put it (the observer compares it with the node asked)
        self.say(rank=rank, pid=os.getpid(), host=socket.gethostname())
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 5)
        if len(fds) != 5:
            raise RuntimeError("the observer sent no control page")
        hello = json.loads(msg)
        self.ctl = Control(fds[0])
        self.data = mmap.mmap(fds[1], hello["data_bytes"])
        self.bell = fds[2]  # the observer's doorbell (non-blocking)
        self.wake = fds[3]  # this rank's wake-up calls from the observer
        self.feed = fds[4]  # a batch's inputs, call after call (protocol.py)
        for fd in fds[:2]:
            os.close(fd)

    def ring(self) -> None:
        try:
            os.write(self.bell, b"!")
        except BlockingIOError:  # full: the observer is awake anyway
            pass

    def remap(self, size: int):
        self.sock.setblocking(True)
        _msg, fds, _flags, _addr = socket.recv_fds(self.sock, 4096, 1)
        self.data = mmap.mmap(fds[0], size)
        os.close(fds[0])
        return self.data

    def say(self, **fields: Any) -> None:
        self.sock.sendall(json.dumps(fields).encode() + b"\n")


def load_solution(path: str, entry: str):
    spec = importlib.util.spec_from_file_location("commbench_solution", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["commbench_solution"] = module
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise AttributeError(f"the solution defines no function {entry!r}")
    return fn


def world_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    raise RuntimeError("the launcher did not say which rank this is")


def main(argv: list[str]) -> int:
    # the harness ends MPI itself, from mpi4py's code (see `finalize`), not from the
    # interpreter's exit handlers, whose calls the run-time guard cannot tell from the
    # solution's once it is armed
    import mpi4py

    mpi4py.rc.finalize = False
    job = JobSpec.from_json(Path(argv[0]).read_text())
    rank = world_rank()
    status = Status(Path(job.out) / status_file(rank))
    try:
        # a job over several nodes: its node's agent serves it (the socket's folder)
        link = Link(os.path.dirname(on_this_host(job.agent_socket))
                    if job.agent_socket else job.job_dir, rank)
    except OSError as exc:
        status.update(error=f"could not reach the observer: {exc}")
        return 4
    try:
        run(job, rank, status, link)
        finalize()
    except BaseException as exc:  # reported for a human to read; the verdict is the observer's
        text = DESCRIBE[0](exc)
        status.update(error=text.strip().splitlines()[-1][:2000] if text.strip() else
                      type(exc).__name__, traceback=text[-6000:])
        sys.stderr.write(f"[commbench rank {rank}] {status.data['phase']}: {text[-6000:]}\n")
        sys.stderr.flush()
        try:  # the observer ends the job soon if the abort below hangs
            link.say(raised=True)
        except Exception:  # noqa: BLE001 - the status file still says it
            pass
        ABORT[0](3)
        return 3
    return 0


ABORT = [lambda code: os._exit(code)]


def finalize() -> None:
    """MPI_Finalize, called through mpi4py (a solution may have finalized already)."""
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def warm_up_cupy(scratch: Path) -> None:
    """cupy loads its libraries through ctypes and compiles kernels in temporary folders on
    first use: do both before the audit hook is installed (it refuses ctypes afterwards)."""
    import cupy
    from cupy_backends.cuda import libs

    for name in ("cublas", "cusolver", "cusparse", "curand", "nccl", "nvrtc"):
        try:
            getattr(libs, name)
        except Exception:  # noqa: BLE001 - a library this machine lacks is not needed
            pass
    try:
        x = cupy.arange(4, dtype=cupy.float32)
        (x * 2 + 1).sum().get()
        x @ cupy.ones((4,), dtype=cupy.float32)
        cupy.cuda.runtime.deviceSynchronize()
    except Exception:  # noqa: BLE001 - the solution will meet it (and be charged) itself
        pass


def guard(job: JobSpec, rank: int, solution: str, scratch: Path) -> None:
    """From here on the process runs the solution's code: its memory is closed to other
    processes (host backend), forbidden library calls end it (the preloaded interposer), and
    Python solutions run under an audit hook. Everything the harness needs afterwards is
    imported before."""
    import tempfile

    from mpi4py import MPI

    tempfile.tempdir = str(scratch)
    ABORT[0] = MPI.COMM_WORLD.Abort
    if job.backend == "cpu":
        # no other process (a peer rank) may read or write this one's memory through
        # /proc/<pid>/mem (the ranks share a user: only this closes it). Not on GPU ranks:
        # the same permission lets a peer duplicate this rank's descriptors (pidfd_getfd),
        # which CUDA memory shared as POSIX descriptors (torch's symmetric memory) needs
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    elif job.language == "python":
        warm_up_cupy(scratch)
    if os.environ.get(ENV_GUARD_REPORT):
        arm = getattr(ctypes.CDLL(None), "commbench_guard_arm", None)
        if arm is not None:
            arm()
    if job.language == "python" and job.audit:
        from . import guard as audit

        # the status files are only quoted in messages: the solution may write them
        DESCRIBE[0] = audit.install(
            solution=solution, writable=[job.scratch, job.out],
            report=str(Path(job.out) / guard_file(rank)),
            hidden_modules=[__package__, "pytest_commbench", "pytest", "_pytest"])


def watchdog(job: JobSpec, rank: int) -> None:
    """Shortly before the job's deadline, write every thread's Python stack to the out
    folder: where a hung rank was stuck, for the timeout's message."""
    import faulthandler

    deadline = float(job.deadline_s or 0)
    if deadline <= 0:
        return
    try:
        f = open(Path(job.out) / stack_file(rank), "w")  # noqa: SIM115 - kept open
    except OSError:
        return
    WATCHDOG.append(f)
    faulthandler.dump_traceback_later(max(deadline * 0.9 - 2.0, 1.0), file=f)


WATCHDOG: list[Any] = []


def run(job: JobSpec, rank: int, status: Status, link: Link) -> None:
    watchdog(job, rank)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    size = world.Get_size()
    backend = make_backend(job.backend)
    solution_comm = world.Dup()
    # a communicator of the harness's own that nothing is sent on: probing it drives MPI's
    # progress between calls where the ranks span nodes (see JobSpec.spans_nodes)
    progress = world.Dup().Iprobe if job.spans_nodes else None
    scratch = Path(job.scratch) / f"r{rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    gpu = None
    if backend.device:
        from .gpu import GpuWorld, local_rank, pin_cpus, share_gpu

        share_gpu(job, rank, size, local_rank(world), backend.vendor)
        pin_cpus(local_rank(world))
        status.update(phase="set up the GPU world")
        harness = world.Dup()
        gpu = GpuWorld(job, world, harness, rank, size, backend)
        extra = {"device": gpu.device, "local_rank": gpu.local_rank, "stream": gpu.stream,
                 "nccl": gpu.nccl}
        if gpu.torch is not None:  # torch tasks: the process group, the stream as torch's
            extra.update(group=gpu.torch.group, torch_stream=gpu.torch.stream)

    watch = arm_cupti(job) if gpu is not None else None

    # from here on every failure is the solution's: the observer knows this rank got here
    status.update(phase="load solution")
    link.say(phase="loading")
    solution = job.solution
    calls = Calls(link, backend, None)  # before the guard: it imports what it needs
    calls.progress = progress
    calls.report = str(Path(job.out) / guard_file(rank))
    if watch is not None:
        calls.window = watch.commbench_guard_cupti_window
    if gpu is not None and job.stress:
        from .gpu import device_hold

        calls.hold_device = device_hold(gpu.stream)
    if gpu is not None and gpu.torch is not None:
        calls.wrap = gpu.torch.tensor  # torch tasks get their buffers as torch tensors
    if job.language in NATIVE_LANGUAGES:
        from .gpu import NativeSolution

        guard(job, rank, solution, scratch)
        fixtures = job.fixtures
        fn = NativeSolution(solution, gpu, "ipc" in fixtures, "host-exchange" in fixtures)
    else:
        guard(job, rank, solution, scratch)
        fn = load_solution(solution, job.entry)
    calls.fn = fn
    for index, case in enumerate(job.cases, start=1):
        status.update(phase=f"case {case['id']}")
        ctx = Context(comm=solution_comm, rank=rank, world_size=size,
                      hostname=socket.gethostname(), params=case["params"], scratch=scratch,
                      **extra)
        calls.case(index, case, ctx)
    if watch is not None:  # the guard is still on (a solution that switched it off ends here)
        watch.commbench_guard_cupti_check()
    status.update(phase="done", done=True)


def arm_cupti(job: JobSpec):
    """The run-time guard of CUDA calls (COMMBENCH_CUPTI_GUARD names the library): armed for
    the solution's shared object before it is loaded, so its constructors are watched too.
    A guard that cannot be armed fails the rank before the solution is loaded (the
    harness's failure, never a run without it)."""
    path = os.environ.get("COMMBENCH_CUPTI_GUARD")
    if not path or job.language not in NATIVE_LANGUAGES:
        return None
    lib = ctypes.CDLL(path)
    lib.commbench_guard_cupti_arm.argtypes = [ctypes.c_char_p]
    if lib.commbench_guard_cupti_arm(job.solution.encode()) != 0:
        raise RuntimeError("the CUDA run-time guard could not be armed (CUPTI refused it)")
    return lib


def forged_word(report: str | None, word: str, k: int, have: int) -> None:
    """End the rank for a control word written by someone other than its harness."""
    text = json.dumps({"forbidden": "the control page",
                       "detail": f"this rank's {word!r} word was {have} before its harness "
                                 f"said {word} for call {k}: the solution wrote it"})
    if report:
        try:
            with open(report, "w") as f:
                f.write(text + "\n")
        except OSError:
            pass
    os._exit(GUARD_EXIT)


class Batch(NamedTuple):
    """A batch's calls, bound before the gate: per call its (context values, arguments,
    solution state), buffer set, inputs' host buffers and stress hold; the outputs' names."""

    argsets: list[tuple[dict, list[Any], Any]]
    sets: list[dict[str, Any]]
    fed_bufs: list[list[Any]]
    holds: list[Any]
    outs: list[str]


class Calls:
    """Makes the calls the observer asks for, in the order of the control page's words."""

    def __init__(self, link: Link, backend, fn) -> None:
        self.link, self.ctl, self.data = link, link.ctl, link.data
        self.backend, self.fn = backend, fn
        self.wrap = None  # how a buffer is handed to a Python solution (None: as it is)
        self.apart = lambda: None
        # the stress phase's device hold: makes this rank's stream wait (rank/gpu.py), set
        # up before the solution is loaded; None: holds are made on the host
        self.hold_device = None
        if backend.device:  # imported now: the harness imports nothing once guarded
            from .gpu import keep_timing_thread_apart

            self.apart = keep_timing_thread_apart
        self.k = 0  # the last call made (numbered over the whole job)
        # drives the rank's MPI between calls (None: not needed, every peer on this node)
        self.progress = None
        # where a control word found ahead of this harness is reported (see `say`)
        self.report: str | None = None
        # the CUDA API guard's call window (rank/cupti_guard.c): open while the solution's
        # call runs, when the harness makes no CUDA call itself (None: no such guard)
        self.window = None
        self.version = -1
        # the case's buffers: as placed in the data segment, as handed to the solution (the
        # same on the host; staged: on the device), and the layout that placed them
        self.shared: dict[str, np.ndarray] = {}
        self.bufs: dict[str, Any] = {}
        self.placed: list[list] = []
        self.args: list[Any] = []
        # a batch's buffer sets handed to the solution, one per call, and their inputs' specs
        self.work: list[dict[str, Any]] | None = None
        self.fed: list = []
        self.staging: list[list[np.ndarray]] = []  # staged: each call's inputs on the host

    def say(self, word: str, k: int) -> None:
        """Set this rank's `word` to k, the harness's own answer to the observer's step k
        ("ready", "took", "done", "saved"). Only this harness writes them, and only after that step
        was asked for: a word already at k or beyond was written by the solution (a thread
        of its own saying the call is done before it is, to move its work out of the timed
        interval). That is a forbidden use of the control page: reported as the guards
        report, and the rank ends with their exit code before the word could count."""
        have = self.ctl.get(word)
        if have >= k:
            forged_word(self.report, word, k, have)
        self.ctl.set(word, k)

    def wait(self, word: str, k: int, case: int) -> bool:
        """Until `word` reaches k (True) or the case has ended (False): spinning for SPIN_S,
        then asleep until the observer's wake-up call (a rank that spins for long takes the
        CPU the observer and the other ranks need)."""
        w, i, end, owner = self.ctl.words, W[word], W["end"], W["case"]
        spin_until = time.perf_counter() + SPIN_S
        progress = self.progress
        nap = 0.05 if progress is None else 0.001
        while w[i] < k:
            if w[end] >= case:
                return False
            if progress is not None:
                progress()
            if time.perf_counter() < spin_until:
                os.sched_yield()
                continue
            ready, _, _ = select.select([self.link.wake], [], [], nap)
            if ready:
                try:
                    while os.read(self.link.wake, 4096):
                        pass
                except BlockingIOError:
                    pass
        # call k is there: it is this case's unless the observer has moved on (it set the
        # next case's first call before this rank saw END of its case)
        return w[owner] <= case

    def case(self, index: int, case: dict, ctx: Context) -> None:
        """The case's calls, one per step the observer sets, until it ends the case: each
        step's buffers, the call (or a batch of calls back to back), then "done" (staged:
        and the outputs fetched, "saved")."""
        b = self.backend
        if b.device:
            self.apart()
        self.bufs, self.shared, self.placed = {}, {}, []
        self.version = -1  # every case starts with buffers of its own (the observer
        # starts every case with a new layout version too)
        while True:
            k = self.k + 1
            if not self.wait("prep" if b.staged else "gate", k, index):
                return
            self.k = k
            info = self.ctl.read_info()
            fresh = self.take_step(info, ctx)
            batch = int(info.get("batch", 1))
            if fresh and hasattr(self.fn, "forget"):  # a compiled solution's old contexts
                self.fn.forget()
            if batch > 1:  # calls back to back, one buffer set (and context values) each
                plan = self.plan_batch(info, case, ctx, batch, fresh)
            else:
                self.bind(case, ctx, self.bufs, fresh)  # context values may change per call
                holds = info.get("holds") or [None]
            if b.staged and not self.stage(k, index):
                return
            if batch > 1:
                self.call_batch(plan, ctx)
            else:
                hold = holds[0]
                if hold and hold[1] == "device" and self.hold_device is not None:
                    self.hold_device(hold[0])  # its stream waits: its work starts late
                self.say("took", k)  # (a late peer's delay counts from here)
                self.call(ctx, settle=b.synchronize)
            b.synchronize()
            if info.get("scrub"):
                self.scrub()
            if not self.finish(k, index):
                return

    def take_step(self, info: dict, ctx: Context) -> bool:
        """What the observer's step says beyond the call: a bigger data segment, context
        values, a new layout of the buffers (True: this step's buffers are new)."""
        if "remap" in info:  # a bigger data segment, sent on the socket
            self.data = self.link.remap(info["remap"])
        for key, value in info.get("extra", {}).items():
            setattr(ctx, key, value)
        fresh = self.ctl.get("layout_version") != self.version
        if fresh:
            b = self.backend
            self.version = self.ctl.get("layout_version")
            self.placed = info["layout"]
            self.shared = views(self.data, self.placed)
            self.bufs = self.shared if not b.staged else {
                name: b.empty(shape, dtype) for name, _kind, shape, dtype, _o in self.placed}
        return fresh

    def plan_batch(self, info: dict, case: dict, ctx: Context, batch: int,
                   fresh: bool) -> Batch:
        """A batch's buffer sets and arguments, one per call, bound before the gate.

        The solution is handed buffers of the rank's own: before each call its inputs are
        read from the feed (staged: and uploaded to its device buffers) and, on the host, its
        poisoned outputs copied in from the segment and out after it (timed alike for the
        reference and the solution); the later calls' inputs are nowhere in this process, nor
        on its device."""
        b = self.backend
        extras = info.get("extras") or [{}] * batch
        holds = info.get("holds") or [None] * batch
        sets = batch_sets(self.bufs, batch)
        fed = info.get("feed") or [[] for _ in range(batch)]  # per call: its inputs
        if b.staged:
            # per call a device set: its outputs are the placed buffers (poisoned
            # before the gate, fetched after the batch), its inputs its own; the
            # observer starts a new layout whenever a call's inputs change shape
            if fresh or self.work is None:
                self.work = [dict(one) for one in sets]
                for work, spec in zip(self.work, fed):
                    work.update({name: b.empty(shape, dtype)
                                 for name, shape, dtype in spec if name not in work})
                self.staging = [[np.empty(shape, dtype) for _n, shape, dtype in spec]
                                for spec in fed]
                self.fed = fed
            fed_bufs = self.staging
        else:
            if fresh or self.work is None or fed != self.fed:
                # a set of the rank's own per call (the calls' shapes may differ)
                self.work = [{name: np.empty_like(a) for name, a in one.items()}
                             for one in sets]
                for work, spec in zip(self.work, fed):
                    work.update({name: np.empty(shape, dtype) for name, shape, dtype in spec})
                self.fed = fed
            fed_bufs = [[work[name] for name, *_ in spec]
                        for work, spec in zip(self.work, fed)]
        outs = [name for name, kind, *_ in self.placed if kind == "out"]
        outs = sorted({name.rpartition(BATCH_SEP)[0] for name in outs})
        argsets = []
        for j in range(batch):
            for key, value in extras[j].items():
                setattr(ctx, key, value)
            # staged: every set's peers mapped (a collective, at the same call on
            # every rank); the host backend maps nothing
            self.bind(case, ctx, self.work[j], fresh and (j == 0 or b.staged))
            state = self.fn.current() if hasattr(self.fn, "current") else None
            argsets.append((extras[j], self.args, state))
        return Batch(argsets, sets, fed_bufs, holds, outs)

    def stage(self, k: int, index: int) -> bool:
        """Staged: the step's inputs uploaded and its outputs poisoned on the device, "ready"
        said; then until the gate opens (False: the case ended first)."""
        b = self.backend
        for name, kind, *_ in self.placed:
            if kind == "in":
                b.upload(self.bufs[name], self.shared[name])
            else:
                b.poison(self.bufs[name])
        b.synchronize()
        self.say("ready", k)
        self.link.ring()
        return self.wait("gate", k, index)

    def call_batch(self, plan: Batch, ctx: Context) -> None:
        """A batch's calls back to back, each on its own buffer set, its inputs put in place
        just before it."""
        b = self.backend
        for (values, args, state), one, work, inputs, spec, hold in zip(
                plan.argsets, plan.sets, self.work, plan.fed_bufs, self.fed, plan.holds):
            # the stress phase holds this rank back before this call: on the host
            # before its inputs are in place (a peer that reads them early reads
            # the last call's), or on its device (its stream waits)
            on_device = bool(hold) and hold[1] == "device" and (
                self.hold_device is not None)
            if hold and not on_device:
                time.sleep(hold[0])
            if b.staged:  # its inputs, uploaded just before it
                read_feed(self.link.feed, inputs)
                for (name, *_), host in zip(spec, inputs):
                    b.upload(work[name], host)
                b.uploaded()  # in place whatever stream the call's work runs on
            else:
                for name, buf in one.items():  # its poisoned outputs
                    np.copyto(work[name], buf)
                read_feed(self.link.feed, inputs)  # its inputs (in-place ones too)
            for key, value in values.items():
                setattr(ctx, key, value)
            self.args = args
            if state is not None:
                self.fn.use(state)
            if hold and on_device:  # its stream waits before the call's work
                self.hold_device(hold[0])
            self.call(ctx)
            if not b.staged:
                for name in plan.outs:
                    np.copyto(one[name], work[name])

    def scrub(self) -> None:
        """The call is complete: its inputs are the caller's again, poisoned now (a peer
        still reading them reads poison); in-place buffers are outputs too."""
        b = self.backend
        outs_here = {name for name, kind, *_ in self.placed if kind == "out"}
        for name, kind, *_ in self.placed:
            if kind == "in" and name not in outs_here:
                b.poison(self.bufs[name])
        b.synchronize()

    def finish(self, k: int, index: int) -> bool:
        """"done" said; staged: the outputs fetched to the segment when asked, "saved" said
        (False: the case ended before the fetch)."""
        self.say("done", k)
        self.link.ring()
        if self.backend.staged:
            if not self.wait("fetch", k, index):
                return False
            for name, kind, *_ in self.placed:
                if kind == "out":
                    np.copyto(self.shared[name], self.backend.to_host(self.bufs[name]))
            self.say("saved", k)
            self.link.ring()
        return True

    def bind(self, case: dict, ctx: Context, bufs: dict, fresh: bool = True) -> None:
        """Resolve the call's arguments; a compiled solution gets its C context filled here
        (peers' buffers mapped through CUDA IPC included)."""
        params = case["params"]
        self.args = [bufs[a] if a in bufs else getattr(ctx, a) if hasattr(ctx, a) else params[a]
                     for a in case["args"]]
        if self.wrap is not None:
            self.args = [self.wrap(a) if hasattr(a, "nbytes") else a for a in self.args]
        if hasattr(self.fn, "prepare"):
            self.fn.prepare([a for a in self.args if hasattr(a, "nbytes")],
                            [a for a in self.args if not hasattr(a, "nbytes")], fresh)

    def call(self, ctx: Context, settle=None) -> None:
        """One call of the solution inside the CUDA API guard's call window; `settle` (the
        device's synchronization), inside it too: what the call left queued runs while the
        window is open, so every copy it makes is the solution's to the guard."""
        if self.window is not None:
            self.window(1)
        try:
            if hasattr(self.fn, "prepare"):
                self.fn()
            else:
                self.fn(ctx, *self.args)
            if settle is not None:
                settle()
        finally:
            if self.window is not None:
                self.window(0)
