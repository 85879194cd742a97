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

Its parts, each in a module of its own: the wire protocol with the ranks (`observer_wire`),
the checks of a call's outputs (`observer_checks`), the timing policy of a case
(`observer_schedule`) and the phase statistics of a job's calls (`observer_phases`). Here:
the job's lifetime (the ranks' connections, the liveness checks, what decides blame) and the
call loop.
"""


from __future__ import annotations

import os
import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checks.base import Case, Op, Trial
from .observer_checks import (
    WrongAnswer,
    expected_outputs,
    held_back,
    spot_check,
    verify_calls,
)
from .observer_phases import PHASE_TOLERANCE, Timing, charged, phase_baseline
from .observer_schedule import CaseSchedule
from .observer_wire import (
    ANSWER,
    Rank,
    call_outputs,
    describe_call,
    guard_reports,
    plan_layouts,
    read_hello,
    write_inputs,
)
from .rank.protocol import GUARD_EXIT, SOCKET, socket_address
from .verdicts import Verdict

LIVENESS_S = 0.005  # how often a wait looks at the job's processes and sockets
# a rank that said it raised (its solution did, or the harness around it): the job ends this
# long after, if it has not ended by itself (MPI_Abort can hang), not at its deadline
RAISED_GRACE_S = 10.0


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


@dataclass
class Call:
    """One call on every rank (or a batch of calls back to back) while the observer makes it:
    what it is, and when the observer saw each rank's steps of it."""

    k: int  # the call's number in the job
    trials: list[Trial]  # one per call of the batch
    check: bool
    # each rank's outputs taken at its own completion (see Observer.call)
    own: bool
    world: int
    # the ranks in the order their gates open (by their delays)
    order: list[int]
    # staged: the late ranks, prepared at their gate
    late: set[int]
    gate: list[float] = field(init=False)
    done: list[float] = field(init=False)
    left: set[int] = field(init=False)  # the ranks not seen done yet
    # own completion: when each rank was told to fetch, when it said it had saved, and
    # its outputs as they were then (the host backend: when it said it was done)
    fetched: list[float] = field(init=False)
    saved: list[float] = field(init=False)
    taken: list[dict[str, np.ndarray] | None] = field(init=False)
    before: float = 0.0  # the untimed phases (see Timing)
    after: float = 0.0

    def __post_init__(self) -> None:
        n = self.world
        self.gate, self.done, self.fetched, self.saved = ([0.0] * n for _ in range(4))
        self.left = set(range(self.world))
        self.taken = [None] * self.world

    @property
    def trial(self) -> Trial:
        """The first call's trial: its delays are the call's."""
        return self.trials[0]

    @property
    def batch(self) -> int:
        return len(self.trials)

    def timing(self) -> Timing:
        """The time of one call (last done - last gate, over the batch's size) and the
        untimed phases around it, likewise per call."""
        return Timing((max(self.done) - max(self.gate)) / self.batch, self.before / self.batch,
                      self.after / self.batch)


class Observer(CaseSchedule):
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
            read, messages = rank.read()
            got += read
            for msg in messages:
                self._heard(rank, msg)
        return got

    def _heard(self, rank: Rank, msg: object) -> None:
        """What decides blame: a rank's "loading" (the solution is loaded from here on), and
        a rank that said it raised once it was."""
        if isinstance(msg, dict) and msg.get("phase") == "loading":
            self.loaded = True
        if isinstance(msg, dict) and msg.get("raised") and self.loaded and \
                self.raised is None:
            self.raised = (rank.number, time.monotonic())

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
            self._accept(pending)
            for conn in list(pending):
                ready, _, _ = select.select([conn], [], [], 0)
                if not ready:
                    continue
                pending.remove(conn)
                self._greet(conn)
            if any(r is None for r in self.ranks):
                if self.job.overdue() or not self.job.alive():
                    self.job.timed_out = self.job.overdue()
                    missing = [i for i, r in enumerate(self.ranks) if r is None]
                    raise JobEnded(Verdict.INFRA_ERROR,
                                   f"ranks {missing} never reached the observer")
                time.sleep(0.001)
        self.server.close()  # nobody else may claim a rank
        self.path.unlink(missing_ok=True)

    def _accept(self, pending: list[socket.socket]) -> None:
        """A new connection, if one is waiting, added to `pending` (its hello still unread)."""
        try:
            conn, _ = self.server.accept()
            conn.setblocking(True)
            conn.settimeout(10)
            pending.append(conn)
        except BlockingIOError:
            pass

    def _greet(self, conn: socket.socket) -> None:
        """Read a connection's hello and hand the rank it claims its pages."""
        hello = read_hello(conn)
        if hello is None:
            return
        number, host = hello
        if not 0 <= number < self.world or self.ranks[number] is not None:
            conn.close()  # a second claim to a rank is never believed
            return
        if host is not None:
            self.hosts[number] = host
        self.ranks[number] = Rank.greeted(conn, number, self.bell_w)

    # -- calls ---------------------------------------------------------------------------
    def _lay_out(self, trials: list[Trial], holds: list | None = None,
                 scrub: bool = False) -> bool:
        """Describe this call's buffers (one set per call of a batch) to every rank and
        poison its outputs (a new layout and, if needed, a bigger segment where the shapes
        changed). The inputs are written later, each rank's just before its own gate
        (`_write_inputs`)."""
        layouts, feeds, changed = plan_layouts(self.ranks, trials)
        if changed:
            self.version += 1
        for number, ((placed, size), feed) in enumerate(zip(layouts, feeds)):
            describe_call(self.ranks[number], placed, size, feed, trials, holds, scrub,
                          self.version)
        return changed

    def _write_inputs(self, number: int, trials: list[Trial]) -> None:
        """Rank `number`'s inputs of this call, written the moment before it may start: no
        rank's inputs are in any process's reach long before that rank's gate, so there is
        no window in which a solution's thread could do the call's work before it is timed."""
        write_inputs(self.ranks[number], trials)

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
        trials = trial if isinstance(trial, list) else [trial]
        if len(trials) > 1 and any(d for t in trials for d in t.delays):
            raise ValueError("a batch of calls has no late ranks")
        own = self._takes_own_completion(trials, own_completion, holds)
        wants, slacks = expected_outputs(self.op, case, trials, check)
        c = self._begin(trials, check, own, holds, scrub)
        if self.staged:
            self._upload(c)
        self._open_gates(c)
        self._await_dones(c)
        early = self._spot_checks(c, wants, slacks) if not self.staged and not own else []
        if self.staged and not own:
            self._fetch(c)
        if check:
            self._judge(c, case, wants, slacks, holds, early)
        return c.timing()

    def _takes_own_completion(self, trials: list[Trial], own_completion: bool,
                              holds: list | None) -> bool:
        """Whether each rank's outputs are taken at its own completion: asked for, and the
        call holds a rank back (a rank held back on its device counts as late too)."""
        held_on_device = len(trials) == 1 and bool(holds) and any(holds)
        return own_completion and len(trials) == 1 and (any(trials[0].delays)
                                                        or held_on_device)

    def _begin(self, trials: list[Trial], check: bool, own: bool, holds: list | None,
               scrub: bool) -> Call:
        """Lay the call out on every rank, number it, and tell every rank its case."""
        changed = self._lay_out(trials, holds, scrub and len(trials) == 1)
        self.k += 1
        for r in self.ranks:
            r.set("case", self.case_no)
        delays = trials[0].delays
        order = sorted(range(self.world), key=lambda i: delays[i])
        # staged: a late rank is prepared at its gate (see protocol.py), except in a call
        # with a new layout, whose preparation allocates and maps buffers on all ranks
        # together (CUDA IPC handles are exchanged): there every rank is prepared first
        late = ({i for i in range(self.world) if delays[i] > 0}
                if self.staged and not changed else set())
        return Call(self.k, trials, check, own, self.world, order, late)

    def _upload(self, c: Call) -> None:
        """Staged: every rank that is not late prepares its inputs (written just before it
        is asked), until each says it is ready. The upload: from this rank's inputs being
        written to its "ready" (the rank's whole device idle); the solution's work hidden
        here is charged (`Timing`)."""
        prep = [0.0] * self.world
        for i in c.order:
            if i not in c.late:
                self._write_inputs(i, c.trials)
                prep[i] = time.perf_counter()
                self._ask(i, "prep", c.k)
        seen = [0.0] * self.world
        ranks, late, k = self.ranks, c.late, c.k

        def prepared() -> bool:
            for i in range(self.world):
                if i not in late and not seen[i] and ranks[i].ctl.get("ready") >= k:
                    seen[i] = time.perf_counter()
            return all(seen[i] for i in range(self.world) if i not in late)

        self._spin(prepared)
        c.before = max([seen[i] - prep[i] for i in range(self.world) if i not in late],
                       default=0.0)

    def _open_gates(self, c: Call) -> None:
        """Open every rank's gate in turn, a late rank's at its delay (its inputs written
        just before; staged, it is prepared there too); the others' "done"s are taken while
        it waits."""
        trial = c.trial
        start = time.perf_counter()
        for i in c.order:
            at = start + trial.delays[i]
            # a late rank's gate: the others' "done"s are taken while it waits
            while time.perf_counter() < at:
                self._collect(c)
                os.sched_yield()
            if trial.delays[i] > 0:
                # once more as the late gate opens: a "done" said while the observer itself
                # was not scheduled (a loaded host) is still seen before the gate, not after
                self._collect(c)
            if not self.staged or i in c.late:
                self._write_inputs(i, c.trials)
            c.gate[i] = time.perf_counter()
            if i in c.late:
                self._ask(i, "prep", c.k)
            self._ask(i, "gate", c.k)

    def _collect(self, c: Call) -> bool:
        """Take every "done" said since the last look (own completion: ask that rank for its
        outputs, or take them, and take those it has saved); True once every rank is done."""
        ranks, k, gate, done, left = self.ranks, c.k, c.gate, c.done, c.left
        # a rank's "done" is taken the moment it is seen, never after another rank's
        # checks: first every timestamp, then what the dones set off
        seen = []
        for i in list(left):
            if gate[i] and ranks[i].ctl.get("done") >= k:
                done[i] = time.perf_counter()
                left.discard(i)
                seen.append(i)
        if c.own:
            for i in seen:
                if self.staged:  # its outputs now, not once the held rank is done too
                    c.fetched[i] = time.perf_counter()
                    self._ask(i, "fetch", k)
                elif c.check:
                    self._take(c, i)
            if self.staged:
                for i in range(self.world):
                    if c.fetched[i] and not c.saved[i] and ranks[i].ctl.get("saved") >= k:
                        c.saved[i] = time.perf_counter()
                        if c.check:
                            self._take(c, i)
        return not left

    def _take(self, c: Call, i: int) -> None:
        """Rank i's outputs of the call, as they are now (own completion)."""
        c.taken[i] = self.ranks[i].outputs(c.trial.outputs[i])

    def _await_dones(self, c: Call) -> None:
        """Wait until every rank is done (own completion, staged: and has saved its outputs,
        the fetch phase then being the longest of those)."""
        if c.own and self.staged:
            self._spin(lambda: self._collect(c) and all(c.saved))
            c.after = max(b - a for a, b in zip(c.fetched, c.saved))
        else:
            self._spin(lambda: self._collect(c))

    def _spot_checks(self, c: Call, wants: list, slacks: list) -> list[str]:
        """The host backend, the moment the last rank said it was done: every rank's outputs
        at positions drawn now. The call's time ends here, so whatever a rank that said
        "done" early had not finished by now is outside it, and wrong (own completion: each
        rank's whole outputs were taken when it said it was done)."""
        early: list[str] = []
        for i in range(self.world):
            for j, (want, slack) in enumerate(zip(wants, slacks)):
                if want is not None:
                    early.extend(spot_check(self.ranks[i], want[i], slack[i] if slack else {},
                                            self.rng, self.op.exact, self.s.rtol, self.s.atol,
                                            j, c.batch))
        return early

    def _fetch(self, c: Call) -> None:
        """Staged: once every rank is done (peers no longer write into anyone's outputs),
        every rank fetches its outputs; the fetch phase lasts until the last says saved."""
        fetch = time.perf_counter()
        for i in range(self.world):
            self._ask(i, "fetch", c.k)
        c.after = max(self._await("saved", c.k)) - fetch

    def _judge(self, c: Call, case: Case, wants: list, slacks: list, holds: list | None,
               early: list[str]) -> None:
        """Every output of every call against the oracle, after what the spot checks found;
        raises WrongAnswer with all of it."""
        events = [{"t_enter": c.gate[i], "t_exit": c.done[i]} for i in range(self.world)]

        def outputs(j: int) -> list[dict[str, np.ndarray]]:
            if c.own:
                return list(c.taken)
            return call_outputs(self.ranks, c.trials[j], j, c.batch)

        errors = list(early) + verify_calls(self.op, case, c.trials, outputs, events, wants,
                                            slacks, self.s.rtol, self.s.atol)
        if errors and c.own and any(c.trial.outputs):
            errors = held_back(errors, c.trial, holds, self.world)
        if errors:
            raise WrongAnswer(errors)

    def end(self, index: int) -> None:
        """Tell every rank that case `index` (1-based) and those before it are over."""
        for r in self.ranks:
            if r is not None:
                r.set("end", index)


__all__ = ["GUARD_EXIT", "PHASE_TOLERANCE", "JobEnded", "Observer", "Settings", "Timing",
           "WrongAnswer", "charged", "guard_reports", "phase_baseline"]
