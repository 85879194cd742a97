"""The observer: drives one job's calls from outside the solution's processes, takes their
times and checks their outputs.

Controller wing; it never loads solution code. It serves the job's Unix socket, hands each
rank its control page and data segment (memory files, see `rank/protocol.py`), and then, call
by call: writes fresh inputs drawn from the item's secret generator, poisons the outputs,
opens every rank's gate (a late rank's later, to check handshakes), takes the time on its
own clock when each rank says it is done, spot-checks that rank's outputs at positions drawn
at that moment (host backend: an early "done" is a wrong answer), and checks every output of
every call against the oracle before the next call. In a trial that holds a rank back, each
rank's outputs are taken at its own completion (staged backends: fetched the moment it says
it is done), so a rank may not leave its outputs for a peer to complete later. Nothing the
ranks write about themselves (times, phases, errors) decides anything; their status files
are only quoted.

What decides who is to blame when a job ends early: whether any rank said it was loading
the solution (on its socket, before the solution's code ran). Before that, a failure is the
harness's or the machine's (`infra_error`); after it, the solution's.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import jobfiles
from .checks.base import Case, Op, Trial, compare
from .rank.protocol import (
    GUARD_EXIT,
    SOCKET,
    Control,
    batch_sets,
    feed_pipe,
    guard_file,
    layout,
    memfd,
    poison_value,
    set_name,
    socket_address,
    views,
)
from .verdicts import Verdict

WARMUP_S = 0.02  # warm-up calls of a case fill at least this long ...
MAX_WARMUP_CALLS = 200  # ... with at most this many
MIN_REPS = 3  # timed repetitions of a case at least, whatever the observer's own time
# small sizes: a timed repetition is a batch of back-to-back calls lasting at least BATCH_S
# (by the warm-up's time per call), of at most MAX_BATCH calls whose buffer sets take at
# most BATCH_BYTES of a rank's segment; the gate, the "done" and the observer's wake-up are
# then paid once per batch, not once per call
BATCH_S = 1e-3
MAX_BATCH = 128
BATCH_BYTES = 64 << 20
DRAWS = 20  # batches drawn at most for one whose inputs fit the feeds
TRIAL_BATCHES = 3  # trial batches timed per step of the batch size's growth
SAMPLES = 16  # positions per output checked the moment a rank says it is done
LIVENESS_S = 0.005  # how often a wait looks at the job's processes and sockets
# a rank that said it raised (its solution did, or the harness around it): the job ends this
# long after, if it has not ended by itself (MPI_Abort can hang), not at its deadline
RAISED_GRACE_S = 10.0
MAX_MESSAGES = 5
CONTROL_BYTES = 1 << 16
# the stress phase: its calls' outputs may take at most STRESS_BYTES of a rank's segment (and
# their inputs its feed); a call after the first holds one rank back with probability
# STRESS_HOLD_P, for STRESS_HOLD_S seconds (drawn in that range), on the host or its device
STRESS_BYTES = 256 << 20
STRESS_HOLD_P = 0.5
STRESS_HOLD_S = (100e-6, 2e-3)
# the first call of a case: its held rank's stream waits this long (drawn in the range), set
# before the call begins, so it must outlast the set-up work a call on new buffers does on
# the host first (exchanging and opening IPC handles takes milliseconds)
FIRST_HOLD_S = (10e-3, 40e-3)
# the word a rank's harness answers each of the observer's steps with
ANSWER = {"prep": "ready", "gate": "done", "fetch": "saved"}


class JobEnded(Exception):
    """The job ended (or must end) before the observer was done with it."""

    def __init__(self, verdict: Verdict, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.verdict, self.message, self.detail = verdict, message, detail


@dataclass
class Settings:
    reps: int  # timed repetitions per case, at least
    max_reps: int  # ... and at most
    timing_budget: float  # timed seconds per case the repetitions may add up to
    warmup: int  # untimed calls before the repetitions, at least
    wall_s: float  # seconds per case the observer may spend on the repetitions in all
    rtol: float
    atol: float
    # calls made back to back after each case's trials (the stress phase; 0: none), see
    # Observer.stress
    stress: int = 0


@dataclass(frozen=True)
class Timing:
    """One call as the observer saw it: `call` from the last gate to the last "done"; on a
    staged (GPU) backend also the untimed phases around it, whose length the solution can
    stretch with work of its own: `before`, the longest upload (inputs written to the rank's
    "ready", its whole device idle) and `after`, the fetch of the outputs (all ranks done to
    the last "saved"). See `charged`."""

    call: float
    before: float = 0.0
    after: float = 0.0


PHASE_TOLERANCE = (0.25, 20e-6)  # (fraction of the baseline, seconds) never charged


def charged(timings: list[Timing], baseline: tuple[float, float] | None) -> list[float]:
    """Each call's time with the untimed phases' systematic excess added: a solution that
    says it is done before its work is (the rank's process can write any word) or does the
    work while its inputs are uploaded makes those phases longer than the reference's. Per
    job and phase, the median over its calls is compared with the baseline, `baseline`
    being the medians of the item's warm-up reference job (None: untimed jobs, the warm-up
    itself); what exceeds it by more than PHASE_TOLERANCE is added to every call of the job,
    the reference's jobs included. Medians, so that a copy that was slow once (pageable
    memory, a page fault) charges nothing; the tolerance, so that job-to-job drift does not."""
    if baseline is None or not timings:
        return [t.call for t in timings]
    extra = 0.0
    for got, base in ((float(np.median([t.before for t in timings])), baseline[0]),
                      (float(np.median([t.after for t in timings])), baseline[1])):
        extra += max(0.0, got - base - PHASE_TOLERANCE[0] * base - PHASE_TOLERANCE[1])
    return [t.call + extra for t in timings]


def phase_baseline(timings: list[Timing]) -> tuple[float, float] | None:
    """The medians of a reference job's upload and fetch phases (None: no calls)."""
    if not timings:
        return None
    return (float(np.median([t.before for t in timings])),
            float(np.median([t.after for t in timings])))


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


class Observer:
    def __init__(self, job_dir: Path, world: int, op: Op, settings: Settings,
                 rng: np.random.Generator, staged: bool, timed: bool,
                 trials: bool = True, batch: bool = False,
                 batches: dict[str, int] | None = None) -> None:
        """`batch`: timed repetitions may be batches of calls; `batches`: the calls per
        batch of each case, fixed by an earlier job of the item (the same for the reference
        and the solution), else chosen here and kept in it."""
        self.job_dir, self.world, self.op, self.s = job_dir, world, op, settings
        self.rng, self.staged, self.timed, self.trials = rng, staged, timed, trials
        self.batch = batch and op.batchable
        self.batches = {} if batches is None else batches
        self.path = job_dir / SOCKET
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = socket_address(str(job_dir))
        try:
            self.server.bind(address)
        finally:
            os.close(fd)
        self.server.listen(world + 4)
        self.server.setblocking(False)
        self.ranks: list[Rank | None] = [None] * world
        # each rank's host, as its harness said when it connected (before the solution was
        # loaded): where the launcher put it
        self.hosts: list[str | None] = [None] * world
        # the doorbell: ranks write a byte after each word they set, so the observer sleeps
        # in the kernel instead of spinning on a CPU the ranks need
        self.bell_r, self.bell_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.loaded = False
        self.raised: tuple[int, float] | None = None  # (rank, when) a rank said it raised
        self.job = None
        self.k = 0
        self.version = 0
        self.where = ""  # the case and call being made, for a timeout's message
        self.case_no = 0  # the case being run, 1-based (the CASE word)

    def progress(self) -> str:
        """Where each rank was in the current call, from the words it set (a hung job's
        message: which rank never came back, and from what)."""
        if not self.k:
            return f"{self.where}no call was made yet"
        steps = ([("ready", "preparing its inputs"), ("gate", "waiting for its gate"),
                  ("done", "in the call (the solution or the device synchronize)"),
                  ("saved", "fetching its outputs")] if self.staged else
                 [("gate", "waiting for its gate"),
                  ("done", "in the call (the solution's code)")])
        parts = []
        for r in self.ranks:
            if r is None:
                continue
            doing = "finished it"
            for word, what in steps:
                if r.ctl.get(word) < self.k:
                    doing = what
                    break
            parts.append(f"rank {r.number}: {doing}")
        return f"{self.where}call {self.k}: " + "; ".join(parts)

    # -- plumbing ------------------------------------------------------------------------
    def close(self) -> None:
        for r in self.ranks:
            if r is not None:
                r.close()
        self.server.close()
        self.path.unlink(missing_ok=True)
        for fd in (self.bell_r, self.bell_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _check(self) -> None:
        """Raise JobEnded when the job ended or ran out of time; read the ranks' sockets."""
        self._read_sockets()
        if self.job.overdue():
            self.job.timed_out = True
            if self.loaded:
                limit = self.job.end - self.job.start
                raise JobEnded(Verdict.TIMEOUT, f"the job did not finish within {limit:g} s "
                                                "and was killed", self.progress())
            raise JobEnded(Verdict.INFRA_ERROR, "the job's ranks did not start within the "
                                                "deadline (the solution was not loaded yet)")
        if not self.job.alive():
            raise JobEnded(Verdict.RUNTIME_ERROR, "the job ended early")
        if self.raised is not None and time.monotonic() - self.raised[1] > RAISED_GRACE_S:
            raise JobEnded(Verdict.RUNTIME_ERROR,
                           f"rank {self.raised[0]} raised and the job had not ended "
                           f"{RAISED_GRACE_S:g} s later; it was stopped")

    def _read_sockets(self) -> int:
        """Read what the ranks said (at most one read per rank); returns the bytes read."""
        conns = [r.conn for r in self.ranks if r is not None]
        if not conns:
            return 0
        ready, _, _ = select.select(conns, [], [], 0)
        got = 0
        for conn in ready:
            rank = next(r for r in self.ranks if r is not None and r.conn is conn)
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                continue
            got += len(data)
            rank.buffer = (rank.buffer + data)[-65536:]
            while b"\n" in rank.buffer:
                line, rank.buffer = rank.buffer.split(b"\n", 1)
                if len(line) > 1024:  # the harness's messages are short: nothing to read
                    continue
                try:
                    msg = json.loads(line)
                except Exception:  # noqa: BLE001 - whatever a rank sends, the observer lives
                    continue
                if isinstance(msg, dict) and msg.get("phase") == "loading":
                    self.loaded = True
                if isinstance(msg, dict) and msg.get("raised") and self.loaded and \
                        self.raised is None:
                    self.raised = (rank.number, time.monotonic())
        return got

    def settle(self, most: int = 1 << 22) -> None:
        """Read everything the ranks said before the job ended (at most `most` bytes): the
        verdict of a job that ended early rests on `loaded`, and a rank's "loading" may still
        be unread in its socket when the observer stopped for another reason (a job that died
        before the observer looked, a send to a rank that was gone). Called once the job is
        over: every sender is gone, so what is there is all there will be."""
        while most > 0:
            got = self._read_sockets()
            if not got:
                return
            most -= got

    def _spin(self, cond) -> None:
        """Wait until cond() is true: asleep until a rank rings the doorbell, looking at the
        job at least every LIVENESS_S."""
        next_look = time.perf_counter() + LIVENESS_S
        while not cond():
            ready, _, _ = select.select([self.bell_r], [], [], LIVENESS_S)
            if ready:
                try:
                    while os.read(self.bell_r, 65536):
                        pass
                except BlockingIOError:
                    pass
            now = time.perf_counter()
            if now >= next_look:
                self._check()
                next_look = now + LIVENESS_S

    def connect(self, job) -> None:
        """Accept one connection per rank; each says its rank once and gets its pages."""
        self.job = job
        pending: list[socket.socket] = []
        while any(r is None for r in self.ranks):
            try:
                conn, _ = self.server.accept()
                conn.setblocking(True)
                conn.settimeout(10)
                pending.append(conn)
            except BlockingIOError:
                pass
            for conn in list(pending):
                ready, _, _ = select.select([conn], [], [], 0)
                if not ready:
                    continue
                pending.remove(conn)
                try:
                    hello = json.loads(conn.recv(4096).split(b"\n")[0])
                    number = int(hello["rank"])
                except (OSError, ValueError, KeyError, TypeError):
                    conn.close()
                    continue
                if not 0 <= number < self.world or self.ranks[number] is not None:
                    conn.close()  # a second claim to a rank is never believed
                    continue
                host = hello.get("host") if isinstance(hello, dict) else None
                if isinstance(host, str) and 0 < len(host) <= 255 and host.isprintable():
                    self.hosts[number] = host
                rank = Rank(conn, number)
                rank.grow(1 << 16)
                socket.send_fds(conn, [json.dumps({"data_bytes": rank.data_bytes}).encode()],
                                [rank.ctl_fd, rank.data_fd, self.bell_w, rank.wake_r,
                                 rank.feed_r])
                os.close(rank.feed_r)  # the rank's end alone
                rank.feed_r = -1
                conn.setblocking(False)
                self.ranks[number] = rank
            if any(r is None for r in self.ranks):
                if self.job.overdue() or not self.job.alive():
                    self.job.timed_out = self.job.overdue()
                    missing = [i for i, r in enumerate(self.ranks) if r is None]
                    raise JobEnded(Verdict.INFRA_ERROR,
                                   f"ranks {missing} never reached the observer")
                time.sleep(0.001)
        self.server.close()  # nobody else may claim a rank
        self.path.unlink(missing_ok=True)

    # -- calls ---------------------------------------------------------------------------
    def _lay_out(self, trials: list[Trial], holds: list | None = None,
                 scrub: bool = False) -> bool:
        """Describe this call's buffers (one set per call of a batch) to every rank and
        poison its outputs (a new layout and, if needed, a bigger segment where the shapes
        changed). The inputs are written later, each rank's just before its own gate
        (`_write_inputs`)."""
        placed_all = []
        batch = len(trials)
        for number in range(self.world):
            specs = []
            for j, trial in enumerate(trials):
                if batch == 1:  # a batch's inputs go through the feed, not the segment
                    specs += [(n, "in", a.shape, a.dtype)
                              for n, a in trial.inputs[number].items()]
                specs += [(set_name(n, j, batch), "out", shape, dtype)
                          for n, (shape, dtype) in trial.outputs[number].items()]
            placed, size = layout(specs)
            placed_all.append((self.ranks[number], placed, size))
        # a batch's inputs come through the feed: where their shapes change, so does the
        # layout (a staged rank keeps each call's device inputs for the layout's life)
        feeds = [[[[n, [int(x) for x in a.shape], str(a.dtype)] for n, a in t.inputs[r].items()]
                  for t in trials] if batch > 1 else [] for r in range(self.world)]
        changed = any(p != r.placed or f != r.fed
                      for (r, p, _), f in zip(placed_all, feeds))
        if changed:
            self.version += 1
        for number, (rank, placed, size) in enumerate(placed_all):
            remap = size > rank.data_bytes
            if remap:
                rank.grow(size * 2)
            rank.placed = placed
            rank.fed = feeds[number]
            v = views(rank.data, placed)
            inputs = {e[0] for e in placed if e[1] == "in"}
            for name, kind, _shape, _dtype, _off in placed:
                if kind == "out" and name not in inputs:
                    v[name].fill(poison_value(v[name].dtype))
            info: dict[str, Any] = {"layout": placed, "extra": trials[0].extra[number]}
            if batch > 1:
                info.update(batch=batch, extras=[t.extra[number] for t in trials],
                            feed=feeds[number])
            if holds:  # this rank's holds, per call: [seconds, where] or None
                info["holds"] = [[h[1], h[2]] if h and h[0] == number else None
                                 for h in holds]
            if scrub:
                info["scrub"] = True
            if remap:
                info["remap"] = rank.data_bytes
            rank.ctl.write_info(info)
            rank.ctl.set("layout_version", self.version)
            if remap:
                socket.send_fds(rank.conn, [b"{}"], [rank.data_fd])
        return changed

    def _write_inputs(self, number: int, trials: list[Trial]) -> None:
        """Rank `number`'s inputs of this call, written the moment before it may start: no
        rank's inputs are in any process's reach long before that rank's gate, so there is
        no window in which a solution's thread could do the call's work before it is timed."""
        rank = self.ranks[number]
        if len(trials) > 1:  # a batch: every call's inputs in order into the rank's feed
            data = b"".join(np.ascontiguousarray(a).tobytes()
                            for t in trials for a in t.inputs[number].values())
            wrote = os.write(rank.feed_w, data) if data else 0
            if wrote != len(data):  # the last batch's inputs were not all read
                raise RuntimeError(f"rank {number}'s feed took {wrote} of {len(data)} bytes")
            return
        v = views(rank.data, rank.placed)
        for name, value in trials[0].inputs[number].items():
            v[name][...] = value

    def _ask(self, i: int, step: str, k: int) -> None:
        """Ask rank i for step k ("prep", "gate", "fetch"), making sure it has not answered
        yet: its harness writes the answer ("ready", "done", "saved") only once asked, so a
        word already at k was written by the solution (a thread of its own saying a call is
        done before its gate even opened, to move its work out of the timed interval)."""
        word = ANSWER[step]
        have = self.ranks[i].ctl.get(word)
        if have >= k:
            raise JobEnded(Verdict.FORBIDDEN,
                           f"rank {i}'s control page said {word!r} = {have} before the observer "
                           f"asked for {step} {k}: the solution wrote its harness's word (a "
                           "completion the harness did not see is no completion)")
        self.ranks[i].set(step, k)

    def _await(self, word: str, k: int) -> list[float]:
        """Wait until every rank set `word` to k; returns when the observer saw each one."""
        seen = [0.0] * self.world

        def look() -> bool:
            for r in self.ranks:
                if not seen[r.number] and r.ctl.get(word) >= k:
                    seen[r.number] = time.perf_counter()
            return all(seen)

        self._spin(look)
        return seen

    def call(self, case: Case, trial: Trial | list[Trial], check: bool,
             own_completion: bool = False, holds: list | None = None,
             scrub: bool = False) -> Timing:
        """One call on every rank, or a batch of calls back to back (a list of trials, one
        buffer set each, no delays); returns the time of one call (last done - last gate,
        over the batch's size) and the untimed phases around it (staged backends: a rank's
        upload and its fetch), likewise per call.

        `own_completion` (a case's trials): where the call holds a rank back (delays), each
        rank's outputs are taken at its own completion, not once every rank is done: on a
        staged backend the rank is told to fetch them the moment its "done" is seen, and
        the observer copies them out of its segment the moment it says they are saved; on
        the host backend the observer copies them the moment its "done" is seen. Those
        copies are what is checked: a rank whose outputs a peer completes later (after the
        held rank's release) is wrong, whatever they hold once every rank is done.

        `holds`: per call None or (rank, seconds, "host" | "device"): that rank is held back
        before making that call, on the host (it waits before the call; a batch only) or on
        its device (its stream waits), while the others go on.

        `scrub` (one call): each rank poisons its inputs the moment its own call is complete,
        before it says it is done: they are its caller's again, so a peer that still reads
        them then (an end barrier missing or passed too early) reads poison."""
        op = self.op
        trials = trial if isinstance(trial, list) else [trial]
        trial, batch = trials[0], len(trials)
        if batch > 1 and any(d for t in trials for d in t.delays):
            raise ValueError("a batch of calls has no late ranks")
        # a rank held back on its device counts as late too: every output is taken at its
        # rank's own completion
        held_on_device = batch == 1 and bool(holds) and any(holds)
        own = own_completion and batch == 1 and (any(trial.delays) or held_on_device)
        wants: list = [None] * batch
        slacks: list = [None] * batch
        if check and op.samples_outputs:
            wants = [op.expected(t, case.count, case.dtype, case.world, case.params)
                     for t in trials]
            slacks = [None if op.exact else op.slack(t, case) for t in trials]
        changed = self._lay_out(trials, holds, scrub and batch == 1)
        self.k += 1
        k, ranks = self.k, self.ranks
        for r in ranks:
            r.set("case", self.case_no)
        order = sorted(range(self.world), key=lambda i: trial.delays[i])
        # staged: a late rank is prepared at its gate (see protocol.py), except in a call
        # with a new layout, whose preparation allocates and maps buffers on all ranks
        # together (CUDA IPC handles are exchanged): there every rank is prepared first
        late = ({i for i in range(self.world) if trial.delays[i] > 0}
                if self.staged and not changed else set())
        before = after = 0.0
        if self.staged:
            # the upload: from this rank's inputs being written to its "ready" (the rank's
            # whole device idle); the solution's work hidden here is charged (`Timing`)
            prep = [0.0] * self.world
            for i in order:
                if i not in late:
                    self._write_inputs(i, trials)
                    prep[i] = time.perf_counter()
                    self._ask(i, "prep", k)
            seen = [0.0] * self.world

            def prepared() -> bool:
                for i in range(self.world):
                    if i not in late and not seen[i] and ranks[i].ctl.get("ready") >= k:
                        seen[i] = time.perf_counter()
                return all(seen[i] for i in range(self.world) if i not in late)

            self._spin(prepared)
            before = max([seen[i] - prep[i] for i in range(self.world) if i not in late],
                         default=0.0)
        gate = [0.0] * self.world
        done = [0.0] * self.world
        early: list[str] = []
        left = set(range(self.world))
        # own completion: when each rank was told to fetch, when it said it had saved, and
        # its outputs as they were then (the host backend: when it said it was done)
        fetched = [0.0] * self.world
        saved = [0.0] * self.world
        taken: list[dict[str, np.ndarray] | None] = [None] * self.world

        def take(i: int) -> None:
            r = ranks[i]
            taken[i] = {n: np.array(a) for n, a in views(r.data, r.placed).items()
                        if n in trial.outputs[i]}

        def collect() -> bool:
            # a rank's "done" is taken the moment it is seen, never after another rank's
            # checks: first every timestamp, then what the dones set off
            seen = []
            for i in list(left):
                if gate[i] and ranks[i].ctl.get("done") >= k:
                    done[i] = time.perf_counter()
                    left.discard(i)
                    seen.append(i)
            if own:
                for i in seen:
                    if self.staged:  # its outputs now, not once the held rank is done too
                        fetched[i] = time.perf_counter()
                        self._ask(i, "fetch", k)
                    elif check:
                        take(i)
                if self.staged:
                    for i in range(self.world):
                        if fetched[i] and not saved[i] and ranks[i].ctl.get("saved") >= k:
                            saved[i] = time.perf_counter()
                            if check:
                                take(i)
            return not left

        start = time.perf_counter()
        for i in order:
            at = start + trial.delays[i]
            # a late rank's gate: the others' "done"s are taken while it waits
            while time.perf_counter() < at:
                collect()
                os.sched_yield()
            if trial.delays[i] > 0:
                # once more as the late gate opens: a "done" said while the observer itself
                # was not scheduled (a loaded host) is still seen before the gate, not after
                collect()
            if not self.staged or i in late:
                self._write_inputs(i, trials)
            gate[i] = time.perf_counter()
            if i in late:
                self._ask(i, "prep", k)
            self._ask(i, "gate", k)
        if own and self.staged:
            self._spin(lambda: collect() and all(saved))
            after = max(b - a for a, b in zip(fetched, saved))
        else:
            self._spin(collect)
        if not self.staged and not own:
            # the moment the last rank said it was done, every rank's outputs at positions
            # drawn now: the call's time ends here, so whatever a rank that said "done" early
            # had not finished by now is outside it, and wrong (own completion: each rank's
            # whole outputs were taken when it said it was done)
            for i in range(self.world):
                for j, (want, slack) in enumerate(zip(wants, slacks)):
                    if want is not None:
                        early.extend(self._spot_check(i, want[i], slack[i] if slack else {},
                                                      j, batch))
        if self.staged and not own:  # every rank is done: peers no longer write into
            # anyone's outputs
            fetch = time.perf_counter()
            for i in range(self.world):
                self._ask(i, "fetch", k)
            after = max(self._await("saved", k)) - fetch
        if check:
            errors = list(early)
            events = [{"t_enter": gate[i], "t_exit": done[i]} for i in range(self.world)]
            for j, (t, want, slack) in enumerate(zip(trials, wants, slacks)):
                if own:
                    got = list(taken)
                else:
                    sets = [batch_sets(views(r.data, r.placed), batch)[j] for r in ranks]
                    got = [{n: np.array(a) for n, a in sets[r.number].items()
                            if n in t.outputs[r.number]} for r in ranks]
                try:
                    if want is not None:
                        found = op.verify(t, got, events, case, self.s.rtol, self.s.atol,
                                          want=want, slack=slack)
                    else:
                        found = op.verify(t, got, events, case, self.s.rtol, self.s.atol)
                except Exception as exc:  # noqa: BLE001 - outputs an oracle cannot even read
                    found = [f"the outputs could not be checked ({type(exc).__name__}: "
                             f"{str(exc)[:200]})"]
                errors += [f"call {j + 1} of {batch} back to back: {m}" if batch > 1 else m
                           for m in found]
            if errors and own and any(trial.outputs):
                if any(trial.delays):
                    held = ", ".join(str(i) for i in range(self.world) if trial.delays[i] > 0)
                    why = f"rank {held} held back {1e3 * max(trial.delays):g} ms"
                else:
                    h = holds[0]
                    why = f"rank {h[0]}'s stream held back {1e3 * h[1]:.1f} ms on its device"
                errors = [f"{m} ({why}; every rank's outputs as they were when its own call "
                          "completed)" for m in errors]
            if errors:
                raise WrongAnswer(errors)
        return Timing((max(done) - max(gate)) / batch, before / batch, after / batch)

    def _spot_check(self, number: int, want: dict[str, np.ndarray],
                    slack: dict[str, np.ndarray], j: int = 0, batch: int = 1) -> list[str]:
        """Outputs at positions drawn now, the moment the rank said it was done (call j of
        a batch of calls: its buffer set)."""
        rank = self.ranks[number]
        v = batch_sets(views(rank.data, rank.placed), batch)[j]
        errors = []
        exact = self.op.exact
        which = f" (call {j + 1} of {batch} back to back)" if batch > 1 else ""
        for name, w in want.items():
            got = v.get(name)
            w = np.asarray(w)
            if got is None or got.shape != w.shape or got.size == 0:
                continue
            idx = self.rng.integers(0, got.size, size=min(SAMPLES, got.size))
            g = got.reshape(-1)[idx].copy()
            tol = 0.0 if exact else self.s.atol
            if not exact and name in slack:
                tol = tol + np.asarray(slack[name]).reshape(-1)[idx]
            msg = compare(g, w.reshape(-1)[idx], 0.0 if exact else self.s.rtol, tol)
            if msg:
                errors.append(f"rank {number}: output '{name}'{which} was not complete when "
                              f"the rank said it was done (spot check of {idx.size} positions: "
                              f"{msg})")
        return errors

    def run_case(self, case: Case) -> list[Timing]:
        """Trials, warm-up and timed repetitions of one case; returns the repetitions' times.
        Raises WrongAnswer with every message labelled by the call it came from."""
        label = f"count={case.count} {case.dtype}"
        where = ""
        self.where = f"case {case.id} ({label}), "
        self.case_no += 1
        for r in self.ranks:  # every case begins with a new layout (the ranks' new buffers)
            r.placed = []
        times: list[Timing] = []
        try:
            checking = self.trials or not self.timed
            for t, trial in enumerate(case.trials if checking else []):
                where = f"trial {t}"
                self.call(case, trial, check=True, own_completion=True,
                          holds=self._first_hold(case, t, trial), scrub=True)
            if checking and self.s.stress > 1:
                where = "calls back to back"
                self.stress(case)
            if self.timed and self.s.reps > 0:
                where = "warm-up"
                last = self.op.timed_trial(self.rng, case)
                # the first call pays what is paid once (connections set up, code compiled):
                # the warm-up fills WARMUP_S after it
                warm = [self.call(case, last, check=False).call]
                while len(warm) < max(self.s.warmup, 2) or (
                        len(warm) <= MAX_WARMUP_CALLS and sum(warm[1:]) < WARMUP_S):
                    warm.append(self.call(case, last, check=False).call)
                batch = self.batches.get(case.id)
                if batch is None:
                    batch = self.batches[case.id] = self._batch_size(
                        case, last, float(np.median(warm[1:])))
                elif batch > 1:  # the batch's buffer sets, touched once before they are timed
                    self.call(case, self._draw(case, batch), check=False)
                began, spent = time.perf_counter(), 0.0
                while True:
                    where = f"timed repetition {len(times)}"
                    times.append(self.call(case, self._draw(case, batch), check=True))
                    spent += times[-1].call * batch
                    wall = time.perf_counter() - began
                    if len(times) >= self.s.reps and (
                            spent >= self.s.timing_budget or len(times) >= self.s.max_reps
                            or wall >= self.s.wall_s):
                        break
                    # the largest sizes: drawing, writing and checking fresh inputs costs
                    # the observer seconds a call; bandwidth-bound calls vary little
                    if len(times) >= MIN_REPS and wall >= self.s.wall_s:
                        break
            elif self.s.reps > 0:
                # untimed (template, mutants): still a few calls on fresh inputs
                for n in range(min(self.s.reps, 3)):
                    where = f"repetition {n}"
                    self.call(case, self.op.timed_trial(self.rng, case), check=True)
        except WrongAnswer as exc:
            raise WrongAnswer([f"[{label}, {where}] {m}" for m in exc.errors]) from None
        return times

    def _first_hold(self, case: Case, t: int, trial: Trial) -> list | None:
        """The first call of a case (where every rank's buffers are new, so all are prepared
        together): one rank, drawn at random, held back on its device (its stream waits)
        after its call has begun, where the ranks can be (a staged backend, the stress phase
        on). With each rank's inputs poisoned the moment its own call is complete (`scrub`),
        a peer that passes its closing barrier before the held rank has read its inputs is
        caught, whatever its flags held from the calls before (an epoch restarted with the
        size, a barrier that trusts a stale flag), and so is one whose outputs a peer
        completes after its own call (outputs are taken at each rank's own completion, as
        in a late trial). Only where the task has late trials (a peer-completed output is
        no fault where its contract says a peer writes it)."""
        if (t != 0 or not self.staged or self.s.stress <= 1 or not case.late
                or any(trial.delays)):
            return None
        return [(int(self.rng.integers(self.world)), float(self.rng.uniform(*FIRST_HOLD_S)),
                 "device")]

    def stress(self, case: Case) -> bool:
        """The stress phase: `Settings.stress` calls made back to back on every rank, with no
        gate, "done" or fetch between them (as a training loop makes them), each on a buffer
        set of its own with its inputs written just before it, one rank held back on the host
        or on its device before some of them; every output of every call checked. What one
        gated call at a time hides fails here: a barrier dropped after the first calls, flags
        or epochs that go wrong when a peer is a call ahead, scratch a peer overwrites while
        this rank still reads it. Only where the calls fit (segment, feed) and the op's check
        allows batches; False where the case was not stressed."""
        if not self.op.batchable:
            return False
        room = min(r.feed_bytes for r in self.ranks)
        n = self.s.stress
        while n >= 2:
            trials = [self.op.timed_trial(self.rng, case) for _ in range(n)]
            if any(d for t in trials for d in t.delays):
                return False
            outs, ins = footprint(trials, self.world)
            if outs <= STRESS_BYTES and ins <= room:
                break
            n //= 2
        else:
            return False
        holds: list = [None]
        for _ in range(n - 1):
            held = self.rng.random() < STRESS_HOLD_P
            holds.append((int(self.rng.integers(self.world)),
                          float(self.rng.uniform(*STRESS_HOLD_S)),
                          "device" if self.staged and self.rng.random() < 0.5 else "host")
                         if held else None)
        try:
            self.call(case, trials, check=True, holds=holds)
        except WrongAnswer as exc:
            said = "; ".join(f"call {j + 1}: rank {h[0]} held {1e6 * h[1]:.0f} us on its {h[2]}"
                             for j, h in enumerate(holds) if h)
            raise WrongAnswer([f"{m} ({n} calls back to back with no synchronization between "
                               f"them{'; ' + said if said else ''})" for m in exc.errors]
                              ) from None
        return True

    def _draw(self, case: Case, batch: int) -> Trial | list[Trial]:
        """Fresh inputs for a timed repetition: one trial, or one per call of a batch."""
        if batch <= 1:
            return self.op.timed_trial(self.rng, case)
        room = min(r.feed_bytes for r in self.ranks)
        for _ in range(DRAWS):
            trials = [self.op.timed_trial(self.rng, case) for _ in range(batch)]
            if footprint(trials, self.world)[1] <= room:
                return trials
        raise RuntimeError(f"{DRAWS} batches of {batch} calls drawn, none fits the ranks' "
                           f"feeds ({room} bytes)")

    def _batch_size(self, case: Case, trial: Trial, per_call: float) -> int:
        """Calls per timed batch: grown from the warm-up's time per call (which is mostly
        the gate's and the "done"'s cost where calls are short) by timing trial batches until
        one lasts BATCH_S, within MAX_BATCH, BATCH_BYTES of outputs and the ranks' feeds (1:
        no batching here, or a call that is long already). The trial batches also warm the
        buffer sets."""
        if not self.batch or per_call <= 0 or per_call >= BATCH_S:
            return 1
        # in the segment: the outputs (the inputs go through the feed); a call's inputs may
        # vary in size (MoE routing is drawn per call): room for twice the warm-up's in the
        # feed, and a batch that would still not fit is drawn again
        per_set, fed = footprint([trial], self.world)
        most = max(1, min(MAX_BATCH, BATCH_BYTES // max(per_set, 1),
                          min(r.feed_bytes for r in self.ranks) // max(2 * fed, 1)))
        batch = max(1, min(most, int(np.ceil(BATCH_S / per_call))))
        while batch > 1:
            # the fastest of a few: a batch of calls of microseconds that met a scheduler
            # tick would stop the growth where the calls are still mostly the gate's cost
            took = min(self.call(case, self._draw(case, batch), check=False).call
                       for _ in range(TRIAL_BATCHES)) * batch
            if took >= BATCH_S or batch >= most:
                break
            batch = min(most, max(batch + 1, int(np.ceil(batch * BATCH_S / max(took, 1e-9)))))
        return batch

    def end(self, index: int) -> None:
        """Tell every rank that case `index` (1-based) and those before it are over."""
        for r in self.ranks:
            if r is not None:
                r.set("end", index)


def footprint(trials: list[Trial], world: int) -> tuple[int, int]:
    """The most bytes any rank needs for these calls back to back: (outputs, which take its
    segment; inputs, which go through its feed)."""
    outs = max(sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                   for t in trials for shape, dtype in t.outputs[r].values())
               for r in range(world))
    ins = max(sum(a.nbytes for t in trials for a in t.inputs[r].values()) for r in range(world))
    return outs, ins


class WrongAnswer(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__(errors[0] if errors else "")
        self.errors = errors


def guard_reports(out: Path, world: int) -> list[dict]:
    """Reports the run-time guard wrote (a forbidden call ended a rank): `guard_r<rank>.json`
    of each rank in the job's `out` folder, read as `jobfiles` reads a job's files (never
    through a link, never a FIFO, 8 KiB at most)."""
    found = []
    for rank in range(world):
        data = jobfiles.read(out.parent, f"{out.name}/{guard_file(rank)}", 8192)
        if data is None:
            continue
        try:
            line = data.decode(errors="replace").splitlines()[0]
            report = json.loads(line)
            found.append(report if isinstance(report, dict) else {"forbidden": str(report)})
        except Exception:  # noqa: BLE001 - a report the solution mangled is still a report
            found.append({"forbidden": "(unreadable report)"})
    return found


__all__ = ["GUARD_EXIT", "JobEnded", "Observer", "Settings", "Timing", "WrongAnswer", "charged",
           "guard_reports", "phase_baseline"]
