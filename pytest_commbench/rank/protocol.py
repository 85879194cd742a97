"""What the observer (controller) and a rank share: the control page, the data segment, the
messages on the job's socket. The one module both wings import; numpy and stdlib only.

Per rank, the observer creates two memory files (memfd) and hands them to the rank over the
job's Unix socket (SCM_RIGHTS) once the rank has said who it is; they are in no filesystem,
so no other rank can open them by name.

- the control page: int64 words (below) and a JSON area for the next call's layout and
  context values;
- the data segment: this rank's inputs and outputs of the current call, at the offsets the
  layout gives. The observer writes fresh inputs and poisons the outputs before every call,
  and reads the outputs itself after the rank says it is done.

A call k (numbered from 1 over the whole job):
- staged backends (GPU): the observer sets PREP = k; the rank copies the inputs to its
  device, poisons its outputs, waits for its device and sets READY = k;
- the observer opens the gate, GATE = k (host backend: as soon as the inputs are written);
  its clock starts;
- the rank sets TOOK = k and calls the solution, waits until its whole device is idle and
  sets DONE = k; the observer's clock stops for this rank;
- staged backends: the rank waits for its own FETCH = k, copies its outputs back and sets
  SAVED = k. The observer sets a rank's FETCH once it has seen every rank done, except in a
  trial that holds a rank back (below), where it sets it the moment it sees that rank's DONE
  (even before the held rank's gate opens) and checks what the rank copied then: a rank's
  outputs must be complete when its own call is (its whole device idle); no peer may
  complete them later.
A batched call (timed repetitions of small sizes) is B calls back to back behind one gate,
each on a buffer set of its own (fresh inputs each; outputs "<name>@j" in the segment,
context values per set in the layout's "extras"): DONE is set once the last of them is done
and the device is idle, and the observer takes the batch's time over B as each call's. A
batch's inputs are not in the segment: the observer writes them, call after call, into the
rank's feed (a pipe whose read end the rank holds; "feed" in the layout names the buffers of
one call in order) and the rank reads each call's inputs just before that call. Nothing can
look into a pipe without taking the data out, and the rank holds no end to put it back, so
no call can reach the inputs of the calls after it (and fold their work into its own
messages): inputs taken ahead are missing when their call comes, which the rank reports.
END = n tells the rank that case n (1-based) has no more calls. CASE is the case (1-based) that
call k belongs to, set before its first word: a rank that sees the next case's first call
before it saw END of its case leaves that call for the next case's loop.

A late rank (a trial's delay): the observer writes its inputs and sets PREP and GATE together
at its time; its upload is then part of its call, and its peers cannot find its inputs (or
its poisoned outputs) in place before its call began. Its time counts from the moment every
rank on time has said TOOK, not from their gates: on a loaded host a rank may not run for
longer than the delay after its gate opens, and a late rank released before its peers had
even begun would test nothing (a barrier whose root does not wait passed so). Meanwhile the
ranks on time may be told to FETCH (above) and go on to wait for the next call's PREP.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import socket
from dataclasses import asdict, dataclass, field, fields

import numpy as np

PAGE = 1 << 16
WORDS = ("gate", "done", "prep", "ready", "saved", "end", "layout_version", "info_len", "fetch",
         "case", "took")
W = {name: i for i, name in enumerate(WORDS)}
INFO_AT = 256  # byte offset of the JSON area
ALIGN = 256

SOCKET = "ctl.sock"
# the word a rank's harness answers each of the observer's steps with
STEP_ANSWER = {"prep": "ready", "gate": "done", "fetch": "saved"}
# the word it sets as it begins a step's work (the gate's: the moment before the solution's
# call); like an answer, only the harness writes it, and only once the step was asked for
STEP_BEGUN = {"gate": "took"}


def harness_words(step: str) -> tuple[str, ...]:
    """The words only the harness writes in reply to `step`: none may be at k before the
    observer asks for step k."""
    return (STEP_ANSWER[step], *([STEP_BEGUN[step]] if step in STEP_BEGUN else []))
FEED_BYTES = 1 << 20  # a rank's feed (pipe) capacity asked for; what a batch's inputs may take

# -- the rest of the job's contract, spelled once for both wings -------------------------------
# Exit codes. The C guards (interpose.c, cupti_guard.c), the sandbox's first process
# (sandbox_init.py, run with -I -S before any package is importable) and the MPS wrapper
# (mps.py, standard library only) keep copies of theirs; tests/unit/test_protocol.py holds every
# copy to these.
GUARD_EXIT = 86  # a rank ended by a run-time guard (a forbidden call): audit hook, C guards
SANITIZER_EXIT = 87  # a rank run under a memory checker that found an error
SANITIZER_LOG = "sanitizer_r{rank}.txt"  # in the job's out folder: a checker's report per rank
RESOLVE_EXIT = 87  # the interposer found no real function: it does not fit the MPI library
LIMIT_EXIT = 122  # the sandbox stopped the job at one of its limits (and said which)
MPS_FAILED = 124  # the job's MPS daemon could not be started (no rank ran)
SANDBOX_FAILED = 125  # the sandbox could not be built (no rank ran)
# environment the controller gives every rank
ENV_GUARD_REPORT = "COMMBENCH_GUARD_REPORT"  # where a guard writes its report ("%r": the rank)
ENV_RANK_CPUS = "COMMBENCH_RANK_CPUS"  # the CPUs chosen near each rank's GPU
# files a rank writes in the job's out folder: its status, its stacks (a hung rank), a
# guard's report; and the MPS wrapper's state
MPS_STATE = "mps.json"


JOB_FILE = "job.json"  # the job's spec, in its read-only folder


#: languages whose solutions are compiled shared objects with the C entry `commbench_run`
#: (HIP on a CUDA device is built through the HIP->CUDA header; its rank code is CUDA's)
NATIVE_LANGUAGES = ("cuda", "hip")


@dataclass(frozen=True)
class DeviceVendor:
    """What the ranks' device backend does differently by GPU vendor (the job's `backend`
    names one; "cpu" is the host backend). Buffers, streams and IPC go through cupy, whose
    `cupy.cuda.runtime` is CUDA's or, in cupy's ROCm build, HIP's, under the same names; NCCL's
    API is RCCL's by name, from a library of another name."""

    name: str  # the job's backend
    runtime: str  # the runtime cupy must be built for ("cuda" or "hip")
    collectives: str  # the soname of the library behind NCCL's API
    mps: bool  # ranks sharing a GPU are MPS clients, each with an equal share of its SMs


DEVICE_VENDORS = {
    "cuda": DeviceVendor("cuda", "cuda", "libnccl.so.2", mps=True),
    "hip": DeviceVendor("hip", "hip", "librccl.so.1", mps=False),
}


@dataclass(frozen=True)
class JobSpec:
    """What the controller tells every rank of a job (`JOB_FILE`, written once before the
    launch, read-only to the job): the solution and how to load it, the job's folders, its
    deadline, and each case's arguments (never its inputs: those come through the segment)."""

    solution: str  # the built solution (or the Python source) staged in the job's folder
    entry: str  # the function a Python solution exports
    language: str  # python | cuda | ...
    backend: str  # cpu (host MPI) | a DEVICE_VENDORS name: cuda, hip (staged, GPU)
    out: str  # the job's out folder (status, stack and guard files)
    scratch: str  # a folder the ranks may write (one per rank beneath it)
    job_dir: str  # the job's folder, where its socket is
    cases: list = field(default_factory=list)  # [{"id", "args", "params"}], in order
    fixtures: list = field(default_factory=list)  # harness pieces the task asks for
    workspace_bytes: int = 0  # a zeroed device workspace shared through IPC (GPU)
    nccl_lib: str | None = None  # the folder of the NCCL (RCCL) the ranks' communicator is from
    deadline_s: float = 0.0  # the job's deadline (a hung rank's stacks are written before)
    ranks_per_gpu: int = 1  # ranks sharing one GPU (shared placement)
    audit: bool = True  # a Python solution runs under the audit-hook guard
    # the ranks lie on more than one node: between calls each rank keeps its MPI progressing
    # (over a network, a sender's last data may still wait in its MPI's queue when its call
    # returns; a rank asleep outside MPI would never send it, and its peer would hang)
    spans_nodes: bool = False
    # a job over several nodes: the node-local path of the socket this rank's node agent
    # serves (None: the observer's, in `job_dir`)
    agent_socket: str | None = None
    # the observer makes calls back to back with holds (the stress phase): a device rank
    # readies its device hold before the solution is loaded
    stress: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec from its file; keys it does not know are an error (both wings must agree)."""
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"job spec has unknown keys: {sorted(unknown)}")
        return cls(**data)


def status_file(rank: int | str) -> str:
    return f"status_r{rank}.json"


def stack_file(rank: int | str) -> str:
    return f"stack_r{rank}.txt"


def guard_file(rank: int | str) -> str:
    return f"guard_r{rank}.json"


GUARD_REPORT = guard_file("%r")  # the value of ENV_GUARD_REPORT's file name part
#: the evidence files a failing job keeps (rank numbers of up to six digits)
EVIDENCE = r"(status|guard)_r\d{1,6}\.json|stack_r\d{1,6}\.txt|mps\.json"


def layout(specs: list[tuple[str, str, tuple[int, ...], str]]) -> tuple[list[list], int]:
    """Offsets in the data segment for (name, "in"/"out", shape, dtype) entries."""
    placed, at = [], 0
    for name, kind, shape, dtype in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        placed.append([name, kind, [int(s) for s in shape], str(np.dtype(dtype)), at])
        at += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return placed, max(at, ALIGN)


def views(buf, placed: list[list]) -> dict[str, np.ndarray]:
    """numpy arrays over the data segment for a layout (name -> array)."""
    out = {}
    for name, _kind, shape, dtype, offset in placed:
        count = math.prod(int(d) for d in shape)
        out[name] = np.frombuffer(buf, dtype=np.dtype(dtype), count=count,
                                  offset=offset).reshape(shape)
    return out


BATCH_SEP = "@"  # a batched call's buffer set j names its buffers "<name>@j"


def set_name(name: str, j: int, batch: int) -> str:
    return f"{name}{BATCH_SEP}{j}" if batch > 1 else name


def batch_sets(bufs: dict, batch: int) -> list[dict]:
    """The buffer sets of a call of `batch` back-to-back calls (name -> buffer, one dict per
    call); a call of one is its buffers as they are."""
    if batch <= 1:
        return [bufs]
    out: list[dict] = [{} for _ in range(batch)]
    for name, buf in bufs.items():
        base, _, j = name.rpartition(BATCH_SEP)
        out[int(j)][base] = buf
    return out


class Control:
    """The control page of one rank, seen from either side."""

    def __init__(self, fd: int) -> None:
        self.map = mmap.mmap(fd, PAGE)
        self.words = np.frombuffer(self.map, dtype=np.int64, count=len(WORDS))

    def get(self, name: str) -> int:
        return int(self.words[W[name]])

    def set(self, name: str, value: int) -> None:
        self.words[W[name]] = value

    def write_info(self, info: dict) -> None:
        data = json.dumps(info).encode()
        if INFO_AT + len(data) > PAGE:
            raise ValueError(f"call description too large ({len(data)} bytes)")
        self.map[INFO_AT:INFO_AT + len(data)] = data
        self.set("info_len", len(data))

    def read_info(self) -> dict:
        n = self.get("info_len")
        return json.loads(bytes(self.map[INFO_AT:INFO_AT + n]))


def feed_pipe() -> tuple[int, int, int]:
    """A rank's feed: (read end, write end, capacity in bytes), both ends non-blocking, the
    capacity raised towards FEED_BYTES as far as the system lets an unprivileged user."""
    import fcntl

    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    want = FEED_BYTES
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            want = min(want, int(f.read()))
    except (OSError, ValueError):
        pass
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, want)
    except OSError:  # over the user's pipe allowance: the default capacity
        pass
    return r, w, fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)


def read_feed(fd: int, arrays: list) -> None:
    """Fill `arrays` (C-contiguous) in order from the feed; raises RuntimeError where the
    bytes are not all there (the observer wrote every call's inputs before the gate)."""
    for a in arrays:
        if a.nbytes == 0:  # (a rank that gets no rows of this call)
            continue
        view = memoryview(a).cast("B")
        got = 0
        while got < len(view):
            try:
                n = os.readv(fd, [view[got:]])
            except BlockingIOError:
                n = 0
            if n == 0:
                raise RuntimeError(
                    "a batched call's inputs were missing from the harness's feed (something "
                    "in the rank read them before their call)")
            got += n


def memfd(name: str, size: int) -> int:
    """A memory file of `size` bytes that nobody can shrink or grow (sealed): a rank that
    truncated it would otherwise crash the observer with SIGBUS on its next access."""
    import fcntl

    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, max(size, 1))
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def poison_value(dtype: np.dtype | str):
    """What outputs hold before every call: NaN for floats, the integer minimum (maximum for
    unsigned) otherwise; an oracle that finds it knows the element was never written."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return 0


def on_this_host(template: str) -> str:
    """A path of a job over nodes with `{host}` made this node's: its short host name, as the
    node's agent and its ranks both see it."""
    return template.replace("{host}", socket.gethostname().split(".", 1)[0].lower())


def socket_address(folder: str) -> tuple[str, int]:
    """A short address for the socket in `folder` (Unix socket paths are limited to 108
    bytes): through an O_PATH descriptor of the folder. Returns (address, descriptor); the
    caller closes the descriptor once bound or connected."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{SOCKET}", fd


CONTROL_BYTES = 1 << 16
class Rank:
    def __init__(self, conn: socket.socket, number: int) -> None:
        self.conn, self.number = conn, number
        self.ctl_fd = memfd(f"commbench-ctl-{number}", CONTROL_BYTES)
        self.ctl = Control(self.ctl_fd)
        self.data_fd = -1
        self.data = None
        # the rank's wake-up call: a byte after every word the observer sets for it, so a
        # rank that waits long sleeps in the kernel instead of spinning
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # a batch's inputs, call after call (protocol.py): the rank reads, the observer writes
        self.feed_r, self.feed_w, self.feed_bytes = feed_pipe()
        self.data_bytes = 0
        self.buffer = b""
        self.placed: list[list] = []
        self.fed: list = []  # a batch's inputs per call (name, shape, dtype), as last laid out

    @classmethod
    def greeted(cls, conn: socket.socket, number: int, bell: int) -> Rank:
        """Rank `number`, whose harness said hello on `conn`: handed its control page, data
        segment, the observer's doorbell (`bell`), its wake-up pipe and its feed's read end."""
        rank = cls(conn, number)
        rank.grow(1 << 16)
        socket.send_fds(conn, [json.dumps({"data_bytes": rank.data_bytes}).encode()],
                        [rank.ctl_fd, rank.data_fd, bell, rank.wake_r, rank.feed_r])
        os.close(rank.feed_r)  # the rank's end alone
        rank.feed_r = -1
        conn.setblocking(False)
        return rank

    def grow(self, size: int) -> None:
        """A data segment of at least `size` bytes (a new memory file, sent to the rank)."""
        import mmap

        size = max(size, 4096)
        if self.data_fd >= 0:
            os.close(self.data_fd)
        self.data_fd = memfd(f"commbench-data-{self.number}", size)
        self.data = mmap.mmap(self.data_fd, size)
        self.data_bytes = size

    def set(self, word: str, value: int) -> None:
        self.ctl.set(word, value)
        try:
            os.write(self.wake_w, b"!")
        except (BlockingIOError, OSError):  # full (the rank is awake anyway) or closed
            pass

    def read(self) -> tuple[int, list]:
        """What the rank said on its socket (one read): the bytes read, and the messages whose
        lines are whole now (a line too long for the harness's short messages, or one that is
        no JSON, is passed over)."""
        try:
            data = self.conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            return 0, []
        self.buffer = (self.buffer + data)[-65536:]
        messages = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if len(line) > 1024:  # the harness's messages are short: nothing to read
                continue
            try:
                messages.append(json.loads(line))
            except Exception:  # noqa: BLE001 - whatever a rank sends, the observer lives
                continue
        return len(data), messages

    def describe(self, placed: list, size: int, feed: list, info: dict, version: int) -> None:
        """Describe a call's buffers on the control page (layout `version`, `info` the rest
        of what it says of the call) and poison its outputs; a segment too small for them is
        replaced by a bigger one, sent to the rank."""
        remap = size > self.data_bytes
        if remap:
            self.grow(size * 2)
        self.placed = placed
        self.fed = feed
        v = views(self.data, placed)
        inputs = {e[0] for e in placed if e[1] == "in"}
        for name, kind, _shape, _dtype, _off in placed:
            if kind == "out" and name not in inputs:
                v[name].fill(poison_value(v[name].dtype))
        info = {"layout": placed, **info}
        if remap:
            info["remap"] = self.data_bytes
        self.ctl.write_info(info)
        self.ctl.set("layout_version", version)
        if remap:
            socket.send_fds(self.conn, [b"{}"], [self.data_fd])

    def put(self, arrays) -> None:
        """A single call's inputs, (name, values) each, into the segment at their places."""
        v = views(self.data, self.placed)
        for name, value in arrays:
            v[name][...] = value

    def feed(self, data: bytes) -> None:
        """A batch's inputs, every call's in order, into the rank's feed."""
        wrote = os.write(self.feed_w, data) if data else 0
        if wrote != len(data):  # the last batch's inputs were not all read
            raise RuntimeError(f"rank {self.number}'s feed took {wrote} of {len(data)} bytes")

    def outputs(self, names) -> dict[str, np.ndarray]:
        """A copy of the outputs `names` of a single call, as they are in the segment now."""
        return {n: np.array(a) for n, a in views(self.data, self.placed).items() if n in names}

    def close(self) -> None:
        for fd in (self.ctl_fd, self.data_fd, self.wake_r, self.wake_w, self.feed_r,
                   self.feed_w):
            if fd >= 0:
                os.close(fd)
        self.ctl_fd = self.data_fd = self.wake_r = self.wake_w = self.feed_r = self.feed_w = -1
        try:
            self.conn.close()
        except OSError:
            pass
