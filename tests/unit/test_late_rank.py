"""The held rank of the late trials, and each rank's outputs taken at its own completion.

- Which rank a late trial holds back is no luck: every rank is held at least once per item
  (world 2, 4, 8, every task of the suite), tasks with `late_rank = false` get no late trial.
- In a trial that holds a rank back, a rank's outputs are those it had when its own call
  completed (staged backends: fetched the moment it says it is done, not once every rank
  is): driven here through `Observer.call` with rank threads speaking the control-page
  protocol (the real rank loop, `Calls`, over a staged backend in host memory), a rank that
  returns at once while a peer writes its outputs later is a wrong answer; an honest
  solution passes, and the same cheat passes where outputs are taken once every rank is
  done (what the test tells apart).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_commbench import checks
from pytest_commbench.checks import cuda_util, gpu_topology
from pytest_commbench.checks.base import LATE_S, held_ranks, make_late
from pytest_commbench.observer import Observer, Settings, WrongAnswer
from pytest_commbench.rank.backends import HostBackend
from pytest_commbench.rank.harness import Calls, Link
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parents[2]


TASKS = sorted(p.parent for p in (REPO / "suites").glob("*/*/task.toml"))


def _cases(task, world: int, rng: np.random.Generator, late: bool = True) -> list:
    """An item's cases as the runner makes them: every size with every dtype, in order, the
    late trials added to each as it is made (`late`: where the task asks for them). Every
    case at the task's first size (the test's time: drawing the largest sizes' inputs takes
    minutes; which rank is held depends on the case's place only)."""
    op = checks.get(task.check.op)
    cases = []
    for count in [task.sizes[0]] * len(task.sizes):
        for dtype in task.check.dtypes:
            cases.append(op.make_case(rng, f"c{len(cases)}", count, dtype, world,
                                      task.check.params, task.check.trials, 0))
            if late and task.check.late_rank:
                make_late(cases[-1], rng)
    return cases


def _late(trial) -> list[int]:
    return [r for r, d in enumerate(trial.delays) if d > 0]


@pytest.fixture
def any_gpus(monkeypatch):
    """The NVLink-matrix and device-attribute oracles ask this host's GPUs for their answers:
    made-up ones."""
    monkeypatch.setattr(gpu_topology, "expected_matrix",
                        lambda world: np.full((world, world), 18, dtype=np.int64))
    monkeypatch.setattr(cuda_util, "expected_attributes",
                        lambda: np.arange(len(cuda_util.ATTRIBUTES), dtype=np.int64))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_rank_is_held_at_least_once_per_item(world, any_gpus):
    checked = 0
    for path in TASKS:
        task = load_task(path / "task.toml", REPO / "suites")
        op = checks.get(task.check.op)
        plain = op.make_case(np.random.default_rng(0), "c0", task.sizes[0],
                             task.check.dtypes[0], world, task.check.params,
                             task.check.trials, 0)
        if any(any(t.delays) for t in plain.trials):
            continue  # the op holds ranks back itself (a barrier: every rank, in turn)
        cases = _cases(task, world, np.random.default_rng(1))
        # the trials each case has of its own (some ops make more than the manifest's)
        base = [len(c.trials) for c in _cases(task, world, np.random.default_rng(1), False)]
        where = f"{task.relpath} at {world} ranks"
        late = [[_late(t) for t in case.trials if _late(t)] for case in cases]
        if not task.check.late_rank:
            assert late == [[] for _ in cases], where  # untouched: no delay anywhere
            assert [len(c.trials) for c in cases] == base, where
            continue
        checked += 1
        # one rank at a time, LATE_S late, and never the case's first trial (on time)
        for case in cases:
            assert not any(case.trials[0].delays), where
            for t in case.trials:
                assert len(_late(t)) <= 1 and max(t.delays) in (0.0, LATE_S), where
        held = [r for per_case in late for (r,) in per_case]
        assert set(held) == set(range(world)), where
        # the first (smallest) case holds every rank in turn; each later case one, rotating
        assert late[0] == [[r] for r in range(world)], where
        assert task.sizes[0] == min(task.sizes), where  # case 0 is the cheapest size
        for i, per_case in enumerate(late[1:], start=1):
            assert per_case == [[i % world]], where
            assert len(cases[i].trials) == base[i], where  # no extra trial there
        assert len(cases[0].trials) == base[0] + world - 1, where
        # the extra late trials' inputs are drawn afresh: none repeats another trial's
        first = cases[0]
        for a in range(len(first.trials)):
            for b in range(a):
                ta, tb = first.trials[a], first.trials[b]
                same = [np.array_equal(x, tb.inputs[r][name])
                        for r in range(world) for name, x in ta.inputs[r].items()
                        if np.asarray(x).size > 1]
                assert not same or not all(same), f"{where}: trials {b} and {a}"
    assert checked >= 10  # the suite's GPU and CPU tasks, not a vacuous loop


def test_held_ranks_cover_the_world_whatever_the_number_of_cases():
    for world in (2, 3, 4, 8):
        for cases in (1, 2, world - 1, world, 3 * world + 1):
            held = [r for i in range(cases) for r in held_ranks(i, world)]
            assert set(held) == set(range(world)), (world, cases)
            assert len(held) == world + cases - 1  # the extra trials: world - 1, all on case 0
    assert held_ranks(0, 1) == [] and held_ranks(5, 1) == []


def test_an_op_that_holds_ranks_itself_and_a_single_trial_are_left_alone():
    rng = np.random.default_rng(5)
    barrier = checks.get("barrier")
    case = barrier.make_case(rng, "c0", 0, "uint8", 4, {}, 2, 0)
    before = [list(t.delays) for t in case.trials]
    make_late(case, rng)
    assert [list(t.delays) for t in case.trials] == before
    one = checks.get("allreduce").make_case(rng, "c0", 16, "float32", 4, {}, 1, 0)
    make_late(one, rng)
    assert len(one.trials) == 1 and not any(one.trials[0].delays)


class StagedHost(HostBackend):
    """A staged backend without a device: each rank's buffers (its "device memory") apart
    from its segment, inputs copied in before the call and outputs out after it when the
    observer says FETCH, as on a GPU; peers reach them as through CUDA IPC (one process)."""

    name = "staged-host"
    staged = True


class Posts:
    """What the ranks' solutions share (as IPC-mapped buffers and flags would be): per call
    and rank, that rank's buffers, posted when its call began."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.posted: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def post(self, call: int, rank: int, sendbuf, recvbuf) -> None:
        with self.cond:
            self.posted[(call, rank)] = (sendbuf, recvbuf)
            self.cond.notify_all()

    def finish(self, call: int, rank: int, world: int) -> None:
        """A closing barrier: this rank has read what it needed of call `call`; returns once
        every rank has (its inputs are poisoned the moment its call is complete)."""
        with self.cond:
            self.posted[(call, -1 - rank)] = None
            self.cond.notify_all()
            if not self.cond.wait_for(
                    lambda: all((call, -1 - r) in self.posted for r in range(world)),
                    timeout=20):
                raise RuntimeError(f"call {call}: the peers never finished")

    def get(self, call: int, rank: int):
        with self.cond:
            if not self.cond.wait_for(lambda: (call, rank) in self.posted, timeout=20):
                raise RuntimeError(f"rank {rank} never began call {call}")
            return self.posted[(call, rank)]


def _allreduce(kind: str, rank: int, world: int, posts: Posts):
    """A rank's all-reduce (sum). honest: waits for every rank's call to begin, sums their
    sendbufs into its own recvbuf, waits until every rank has read. rank0_does_all: every rank posts its buffers and returns
    at once; rank 0 (a long kernel, 100 ms) writes every rank's recvbuf."""
    calls = [0]

    def solution(ctx, sendbuf, recvbuf):
        calls[0] += 1
        posts.post(calls[0], rank, sendbuf, recvbuf)
        if kind == "rank0_does_all" and rank != 0:
            return  # its outputs are rank 0's business
        bufs = [posts.get(calls[0], r) for r in range(world)]
        total = np.sum([s for s, _ in bufs], axis=0, dtype=sendbuf.dtype)
        if kind == "honest":
            recvbuf[...] = total
            posts.finish(calls[0], rank, world)
            return
        time.sleep(0.1)
        for _, out in bufs:
            out[...] = total

    return solution


class ThreadJob:
    """The job the observer watches: rank threads instead of processes."""

    def __init__(self, threads: list[threading.Thread], limit_s: float = 60) -> None:
        self.threads = threads
        self.start = time.monotonic()
        self.end = self.start + limit_s
        self.timed_out = False

    def overdue(self) -> bool:
        return time.monotonic() > self.end

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)


def _untimed(job_dir: Path, world: int, op, staged: bool) -> tuple[Path, Observer]:
    """A new job folder and an observer of exact checks that times nothing."""
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=0.0, atol=0.0)
    job_dir.mkdir()
    return job_dir, Observer(job_dir, world, op, settings, np.random.default_rng(12),
                             staged=staged, timed=False)


def _judge(tmp_path: Path, kind: str, staged: bool, world: int = 2,
           own: bool | None = True, scrub: bool = True) -> list[str]:
    """The trials of one all-reduce case (the first of an item: one late trial per rank)
    through the observer, the ranks being threads that run the real rank loop. `own`: True,
    through `run_case` (each rank's outputs at its own completion); False, every trial
    through `call` with outputs taken once every rank is done. `scrub`: False, the inputs
    stay in place when a rank's call completes (the check apart from the one that poisons
    them). Returns the wrong answer's messages (none: a pass)."""
    rng = np.random.default_rng(11)
    op = checks.get("allreduce")
    case = op.make_case(rng, "c0", 1000, "float32", world, {}, 2, 0)
    make_late(case, rng)
    assert [_late(t) for t in case.trials] == [[]] + [[r] for r in range(world)]
    job_dir, obs = _untimed(tmp_path / f"job-{kind}-{staged}-{own}-{world}-{scrub}", world,
                            op, staged)
    if not scrub:
        real_call = obs.call
        obs.call = lambda *a, **kw: real_call(*a, **{**kw, "scrub": False})
    posts = Posts()
    with ranks_in_threads(obs, job_dir, case, staged,
                          lambda rank: _allreduce(kind, rank, world, posts)):
        try:
            if own:
                obs.run_case(case)
            else:
                obs.case_no += 1
                for trial in case.trials:
                    obs.call(case, trial, check=True, own_completion=False)
        except WrongAnswer as exc:
            return exc.errors
    return []


@contextlib.contextmanager
def ranks_in_threads(obs: Observer, job_dir: Path, case, staged: bool, solution_for,
                     hold_device=None, calls_class=Calls):
    """The ranks of one case as threads running the real rank loop (`Calls`) on a host or a
    staged host backend, connected to `obs`; `solution_for(rank)` is each rank's solution,
    `hold_device(rank)` (optional) its device hold. Inside the block the observer drives the
    case; afterwards every rank has ended, cleanly."""
    world = obs.world
    failures: list[BaseException] = []
    links: list[Link] = []

    def rank_main(rank: int) -> None:
        try:
            link = Link(str(job_dir), rank)
            links.append(link)
            calls = calls_class(link, StagedHost() if staged else HostBackend(),
                                solution_for(rank))
            calls.rank = rank
            if hold_device is not None:
                calls.hold_device = hold_device(rank)
            link.say(phase="loading")
            ctx = SimpleNamespace(rank=rank, world_size=world)
            calls.case(1, {"id": case.id, "args": case.args, "params": case.params}, ctx)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    try:
        obs.connect(ThreadJob(threads))
        try:
            yield
        finally:
            obs.end(1)
            for t in threads:
                t.join(20)
    finally:
        obs.close()
        for link in links:
            link.sock.close()
            for fd in (link.bell, link.wake, link.feed):
                os.close(fd)
        assert not failures, failures
        assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_an_honest_solution_passes_the_late_trials(tmp_path, staged):
    assert _judge(tmp_path, "honest", staged) == []
    assert _judge(tmp_path, "honest", staged, world=4) == []


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_a_rank_whose_outputs_a_peer_completes_later_is_wrong(tmp_path, staged):
    # the other ranks' inputs are poisoned as their calls complete (at once): rank 0 reads
    # poison (when it reads after the poisoning: a race a thread may win), or fails as below
    errors = _judge(tmp_path, "rank0_does_all", staged)
    assert errors and "got nan" in errors[0], errors
    # with the inputs left in place: caught in the trial that holds rank 0 back, rank 1's
    # outputs, taken when its own call completed, were never written (poison); the message
    # says which trial and why
    errors = _judge(tmp_path, "rank0_does_all", staged, scrub=False)
    assert errors, "rank 1 returned before its outputs were written and passed"
    assert all(m.startswith("[count=1000 float32, trial 1] rank 1: output 'recvbuf'")
               for m in errors), errors
    assert "poison" in errors[0] and "rank 0 held back 2 ms" in errors[0], errors
    # at 4 ranks every rank but rank 0 is wrong there
    errors = _judge(tmp_path, "rank0_does_all", staged, world=4, scrub=False)
    assert {m.split("] ")[1].split(":")[0] for m in errors} == {"rank 1", "rank 2", "rank 3"}


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_the_same_cheat_passes_where_outputs_are_taken_once_every_rank_is_done(tmp_path,
                                                                               staged):
    """What the early fetch (host: the copy at a rank's own "done") adds: taken after the
    last rank's done, the outputs rank 0 wrote for everyone are complete."""
    assert _judge(tmp_path, "rank0_does_all", staged, own=False) == []


def test_a_rank_that_raised_and_hangs_ends_the_job_soon_not_at_its_deadline(tmp_path,
                                                                           monkeypatch):
    """A rank whose solution raised says so on its socket before it aborts the job; where the
    abort hangs (MPI_Abort can), the observer stops the job a grace period later (here 0.3
    s), a runtime_error, instead of waiting out the deadline (here 60 s)."""
    from pytest_commbench import observer as observer_module
    from pytest_commbench.observer import JobEnded

    monkeypatch.setattr(observer_module, "RAISED_GRACE_S", 0.3)
    op = checks.get("allreduce")
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=0.0, atol=0.0)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    obs = Observer(job_dir, 2, op, settings, np.random.default_rng(1), staged=False,
                   timed=False)
    hang = threading.Event()
    links: list[Link] = []

    def rank_main(rank: int) -> None:
        link = Link(str(job_dir), rank)
        links.append(link)
        link.say(phase="loading")
        if rank == 1:
            link.say(raised=True)  # as the harness does before its abort
        hang.wait(30)  # the abort that never returns

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    try:
        obs.connect(ThreadJob(threads))
        start = time.monotonic()
        with pytest.raises(JobEnded) as ended:
            obs._spin(lambda: False)
        assert time.monotonic() - start < 10
        assert ended.value.verdict == "runtime_error" and "rank 1 raised" in ended.value.message
    finally:
        hang.set()
        for t in threads:
            t.join(5)
        obs.close()
        for link in links:
            link.sock.close()
            for fd in (link.bell, link.wake, link.feed):
                os.close(fd)


def _barrier(kind: str, rank: int, world: int, board: dict, cond: threading.Condition):
    """A rank's barrier (no arguments). honest: leaves once every rank has arrived;
    skip_root: rank 0 releases the others as it arrives, then waits for theirs (the CPU
    task's mutant `linear_skip_root`)."""
    calls = [0]

    def solution(ctx):
        calls[0] += 1
        c = calls[0]
        with cond:
            board.setdefault(("in", c), set()).add(rank)
            if kind == "skip_root" and rank == 0:
                board[("released", c)] = True
            cond.notify_all()
            if kind == "honest" or rank == 0:
                done = cond.wait_for(lambda: len(board[("in", c)]) == world, timeout=20)
            else:
                done = cond.wait_for(lambda: board.get(("released", c)), timeout=20)
            if not done:
                raise RuntimeError(f"rank {rank}: call {c} never released")

    return solution


HOLD_S = 0.3  # the barrier trials' delay here (a loaded 2-CPU host runs a thread within it)


class SlowRoot(Calls):
    """Rank 0 runs twice the barrier's delay after its gate opens (a loaded host's
    scheduler: longer than the delay)."""

    def wait(self, word: str, k: int, case: int) -> bool:
        went_on = super().wait(word, k, case)
        if word == "gate" and self.rank == 0:
            time.sleep(2 * HOLD_S)
        return went_on


@pytest.mark.parametrize("kind", ["honest", "skip_root"])
def test_a_late_rank_is_late_after_its_peers_began_however_late_they_run(tmp_path, kind,
                                                                         monkeypatch):
    """A barrier trial holds one rank back (here 300 ms); rank 0, on time, runs only 600 ms
    after its gate opened. Counted from the gates, the late rank would be released before rank 0 even
    arrived, and a root that releases the others without waiting would pass; counted from
    when every rank on time began its call (TOOK), it is caught in every trial that holds
    back a rank other than the root, and an honest barrier passes."""
    from pytest_commbench.checks import barrier

    monkeypatch.setattr(barrier, "DELAY_S", HOLD_S)
    world = 4
    rng = np.random.default_rng(3)
    op = checks.get("barrier")
    case = op.make_case(rng, "c0", 0, "uint8", world, {}, 2, 0)
    job_dir, obs = _untimed(tmp_path / f"job-{kind}", world, op, False)
    board: dict = {}
    cond = threading.Condition()
    errors: list[str] = []
    with ranks_in_threads(obs, job_dir, case, False,
                          lambda rank: _barrier(kind, rank, world, board, cond),
                          calls_class=SlowRoot):
        for trial in case.trials:
            try:
                obs.call(case, trial, check=True, own_completion=True)
            except WrongAnswer as exc:
                late = _late(trial)
                errors.append((late, exc.errors))
    if kind == "honest":
        assert errors == []
        return
    caught = sorted(late for late, _ in errors)
    assert caught == [[r] for r in range(1, world)], errors
    for _late_rank, messages in errors:
        assert all("left the barrier" in m for m in messages), messages
