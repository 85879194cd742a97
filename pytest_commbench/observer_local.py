"""The ranks of a job on the controller's own node (`LocalRanks`): what of the observer touches
a rank's memory or takes a time on its clock. The job's Unix socket, each rank's control page
and data segment (memory files, `rank/protocol.py`), the inputs written the moment before a
rank's gate, every rank's "done" timed on the controller's clock, the spot check the moment
the last rank is done, the outputs read back.

`observer.Observer` keeps the call's plan and its judgement and drives either this or the
ranks of a job over several nodes (`cluster.RemoteRanks`), which do the same through a node
agent on each node.
"""

from __future__ import annotations

import os
import select
import socket
import time
from pathlib import Path

import numpy as np

from .checks.base import Trial
from .observer_call import Call, JobEnded
from .observer_checks import spot_check
from .observer_wire import Rank, call_outputs, read_hello, write_inputs
from .rank.protocol import SOCKET, harness_words, socket_address
from .verdicts import Verdict


class LocalRanks:
    """A job's ranks on this node, served on the job's Unix socket (see the module)."""

    def __init__(self, obs, job_dir: Path, world: int, staged: bool) -> None:
        self.obs, self.world, self.staged = obs, world, staged
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
        self.job = None

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

    def check(self) -> None:
        """Nothing between the controller and its own node's ranks can break apart."""

    def wait(self, timeout: float) -> None:
        """Asleep until a rank rings the doorbell, `timeout` seconds at most."""
        ready, _, _ = select.select([self.bell_r], [], [], timeout)
        if ready:
            try:
                while os.read(self.bell_r, 65536):
                    pass
            except BlockingIOError:
                pass

    def describe(self, number: int, placed: list, size: int, feed: list,
                 trials: list[Trial], holds: list | None, scrub: bool, version: int) -> None:
        from .observer_wire import describe_call

        describe_call(self.ranks[number], placed, size, feed, trials, holds, scrub, version)

    def run(self, c: Call, wants: list, slacks: list) -> list[str]:
        """Make call `c` on every rank, laid out already: their uploads (staged), gates,
        completions and fetches; returns what the spot checks found."""
        if self.staged:
            self._upload(c)
        self._open_gates(c)
        self._await_dones(c)
        early = self._spot_checks(c, wants, slacks) if not self.staged and not c.own else []
        if self.staged and not c.own:
            self._fetch(c)
        return early

    def timing(self, c: Call):
        """The call's time on the controller's clock: last done - last gate (`Call.timing`)."""
        return c.timing()

    def outputs(self, c: Call, j: int) -> list[dict[str, np.ndarray]]:
        """Every rank's outputs of call j of `c` (own completion: as taken at each rank's)."""
        if c.own:
            return list(c.taken)
        return call_outputs(self.ranks, c.trials[j], j, c.batch)

    def connect(self, job) -> None:
        """Accept one connection per rank; each says its rank once and gets its pages."""
        self.job = self.obs.job = job
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

    def read_sockets(self) -> int:
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
                self.obs._heard(rank, msg)
        return got


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
        for word in harness_words(step):
            have = self.ranks[i].ctl.get(word)
            if have >= k:
                raise JobEnded(Verdict.FORBIDDEN,
                               f"rank {i}'s control page said {word!r} = {have} before the "
                               f"observer asked for {step} {k}: the solution wrote its "
                               "harness's word (a completion the harness did not see is no "
                               "completion)")
        self.ranks[i].set(step, k)

    def _await(self, word: str, k: int) -> list[float]:
        """Wait until every rank set `word` to k; returns when the observer saw each one."""
        seen = [0.0] * self.world

        def look() -> bool:
            for r in self.ranks:
                if not seen[r.number] and r.ctl.get(word) >= k:
                    seen[r.number] = time.perf_counter()
            return all(seen)

        self.obs._spin(look)
        return seen

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

        self.obs._spin(prepared)
        c.before = max([seen[i] - prep[i] for i in range(self.world) if i not in late],
                       default=0.0)

    def _open_gates(self, c: Call) -> None:
        """Open every rank's gate in turn, a late rank's at its delay after every rank on
        time began its call (its inputs written just before; staged, it is prepared there
        too); the others' "done"s are taken while it waits."""
        trial = c.trial
        start, waited = time.perf_counter(), False
        for i in c.order:
            if trial.delays[i] > 0 and not waited:
                start, waited = self._all_took(c, [j for j in c.order if not trial.delays[j]]), True
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

    def _all_took(self, c: Call, on_time: list[int]) -> float:
        """Until every rank in `on_time` has begun its call (said TOOK), its "done"s taken
        meanwhile; returns when. A late rank's delay counts from then (protocol.py)."""
        ranks, k = self.ranks, c.k

        def took() -> bool:
            self._collect(c)
            return all(ranks[j].ctl.get("took") >= k for j in on_time)

        self.obs._spin(took)
        return time.perf_counter()

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
            self.obs._spin(lambda: self._collect(c) and all(c.saved))
            c.after = max(b - a for a, b in zip(c.fetched, c.saved))
        else:
            self.obs._spin(lambda: self._collect(c))

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
                                            self.obs.rng, self.obs.op.exact, self.obs.s.rtol, self.obs.s.atol,
                                            j, c.batch))
        return early

    def _fetch(self, c: Call) -> None:
        """Staged: once every rank is done (peers no longer write into anyone's outputs),
        every rank fetches its outputs; the fetch phase lasts until the last says saved."""
        fetch = time.perf_counter()
        for i in range(self.world):
            self._ask(i, "fetch", c.k)
        c.after = max(self._await("saved", c.k)) - fetch
