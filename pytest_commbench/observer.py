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
(`observer_schedule`) and the phase statistics of a job's calls (`observer_phases`); what
touches the ranks' memory and takes their times, `observer_local.LocalRanks` (this node's
ranks) or `cluster.RemoteRanks` (a job over several nodes, through a node agent on each).
Here: the job's lifetime (the liveness checks, what decides blame) and the call loop.
"""


from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checks.base import Case, Op, Trial
from .observer_call import Call, JobEnded
from .observer_checks import WrongAnswer, expected_outputs, held_back, verify_calls
from .observer_local import LocalRanks
from .observer_phases import PHASE_TOLERANCE, Timing, charged, phase_baseline
from .observer_schedule import CaseSchedule
from .observer_wire import Rank, guard_reports, plan_layouts
from .rank.protocol import GUARD_EXIT
from .verdicts import Verdict

LIVENESS_S = 0.005  # how often a wait looks at the job's processes and sockets
# a rank that said it raised (its solution did, or the harness around it): the job ends this
# long after, if it has not ended by itself (MPI_Abort can hang), not at its deadline
RAISED_GRACE_S = 10.0


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


class Observer(CaseSchedule):
    def __init__(self, job_dir: Path, world: int, op: Op, settings: Settings,
                 rng: np.random.Generator, staged: bool, timed: bool,
                 trials: bool = True, batch: bool = False,
                 batches: dict[str, int] | None = None, remote=None) -> None:
        """`batch`: timed repetitions may be batches of calls; `batches`: the calls per
        batch of each case, fixed by an earlier job of the item (the same for the reference
        and the solution), else chosen here and kept in it. `remote`: where the ranks lie
        on other nodes, what makes the side that reaches them (`cluster.RemoteRanks`, called
        with this observer); else they are this node's (`LocalRanks`)."""
        self.job_dir, self.world, self.op, self.s = job_dir, world, op, settings
        self.rng, self.staged, self.timed, self.trials = rng, staged, timed, trials
        self.batch = batch and op.batchable
        self.batches = {} if batches is None else batches
        # what touches the ranks' memory and takes their times
        self.rk = remote(self) if remote is not None else LocalRanks(self, job_dir, world,
                                                                      staged)
        self.loaded = False
        self.raised: tuple[int, float] | None = None  # (rank, when) a rank said it raised
        self.job = None
        self.k = 0
        self.version = 0
        self.where = ""  # the case and call being made, for a timeout's message
        self.case_no = 0  # the case being run, 1-based (the CASE word)

    @property
    def ranks(self) -> list:
        """Each rank (its control page's words, its layout), None until it connected."""
        return self.rk.ranks

    @property
    def hosts(self) -> list[str | None]:
        """Each rank's host, where the launcher put it (None until it connected)."""
        return self.rk.hosts

    def connect(self, job) -> None:
        """Until every rank has connected and got its pages (JobEnded where the job ends or
        runs out of time first)."""
        self.job = job
        self.rk.connect(job)

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
        self.rk.close()

    def _check(self) -> None:
        """Raise JobEnded when the job ended or ran out of time; read the ranks' sockets."""
        self.rk.read_sockets()
        self.rk.check()  # (across nodes: an agent that ended, whatever the ranks did)
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
            got = self.rk.read_sockets()
            if not got:
                return
            most -= got

    def _spin(self, cond) -> None:
        """Wait until cond() is true: asleep until a rank rings the doorbell, looking at the
        job at least every LIVENESS_S."""
        next_look = time.perf_counter() + LIVENESS_S
        while not cond():
            self.rk.wait(LIVENESS_S)
            now = time.perf_counter()
            if now >= next_look:
                self._check()
                next_look = now + LIVENESS_S

    # -- calls ---------------------------------------------------------------------------
    def _lay_out(self, trials: list[Trial], holds: list | None = None,
                 scrub: bool = False) -> bool:
        """Describe this call's buffers (one set per call of a batch) to every rank and
        poison its outputs (a new layout and, if needed, a bigger segment where the shapes
        changed). The inputs are written later, each rank's just before its own gate
        (`LocalRanks._write_inputs`)."""
        layouts, feeds, changed = plan_layouts(self.ranks, trials)
        if changed:
            self.version += 1
        for number, ((placed, size), feed) in enumerate(zip(layouts, feeds)):
            self.rk.describe(number, placed, size, feed, trials, holds, scrub, self.version)
        return changed

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
        early = self.rk.run(c, wants, slacks)
        if check:
            self._judge(c, case, wants, slacks, holds, early)
        return self.rk.timing(c)

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

    def _judge(self, c: Call, case: Case, wants: list, slacks: list, holds: list | None,
               early: list[str]) -> None:
        """Every output of every call against the oracle, after what the spot checks found;
        raises WrongAnswer with all of it."""
        events = [{"t_enter": c.gate[i], "t_exit": c.done[i]} for i in range(self.world)]

        def outputs(j: int) -> list[dict[str, np.ndarray]]:
            return self.rk.outputs(c, j)

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


__all__ = ["GUARD_EXIT", "Call", "Rank", "PHASE_TOLERANCE", "JobEnded", "Observer", "Settings", "Timing",
           "WrongAnswer", "charged", "guard_reports", "phase_baseline"]
