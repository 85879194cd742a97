"""The observer through a node agent (`cluster.RemoteRanks` and `rank/agent.py`) on this
machine: a real agent process on loopback, the ranks threads running the real rank loop
(`Calls`) against the agent's socket, as `test_late_rank.py` drives them against the
observer's own. The late trials (each rank's outputs at its own completion, on the host and
on a staged backend), a word the solution writes for its harness, the agent's death."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from test_late_rank import Posts, StagedHost, ThreadJob, _allreduce, _late

from pytest_commbench import checks, cluster
from pytest_commbench.checks.base import make_late
from pytest_commbench.observer import JobEnded, Observer, Settings, WrongAnswer
from pytest_commbench.rank import harness, wire
from pytest_commbench.rank.backends import HostBackend
from pytest_commbench.rank.harness import Calls, Link
from pytest_commbench.rank.protocol import on_this_host

REPO = Path(__file__).resolve().parents[2]


class AgentJob:
    """The agent step, as the hub watches it: one agent process."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def through_agent(tmp_path: Path, world: int, op, staged: bool, monkeypatch, name: str):
    """An observer whose ranks are reached through one node agent (a process), the agent
    met and its clock measured; yields (observer, agent process)."""
    monkeypatch.setenv(cluster.ADDRESS_ENV, "127.0.0.1")
    monkeypatch.delenv(cluster.LISTEN_ENV, raising=False)
    job_dir = tmp_path / name
    (job_dir / "ro").mkdir(parents=True)
    here = socket.gethostname()
    settings = Settings(reps=0, max_reps=0, timing_budget=0.0, warmup=0, wall_s=0.0,
                        rtol=0.0, atol=0.0)
    job_name = cluster.job_name(job_dir)
    obs = Observer(job_dir, world, op, settings, np.random.default_rng(12), staged=staged,
                   timed=False, remote=lambda o: cluster.RemoteRanks(
                       o, job_dir, world, staged, [here] * world, job_name))
    hub = obs.rk
    spec = hub.write_spec()
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "0", **hub.agent_env(),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    agent = subprocess.Popen([sys.executable, "-m", "pytest_commbench.rank.agent", str(spec)],
                             env=env, stderr=subprocess.PIPE)
    try:
        hub.meet_agents(AgentJob(agent), time.monotonic() + 30)
        yield obs, agent
    finally:
        obs.close()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        agent.stderr.close()
        folder = Path(on_this_host(cluster.agent_socket(job_dir))).parent
        if agent.returncode == 0:  # an agent that stopped removed its socket and folder
            assert not folder.exists()
        shutil.rmtree(folder, ignore_errors=True)  # (a killed one could not)


@contextlib.contextmanager
def ranks(obs: Observer, case, staged: bool, solution_for, forge: int | None = None,
          word: str = "done"):
    """The ranks as threads connected to their agent; `forge`: that rank writes its
    harness's `word` for the next call before its gate opens (the solution's forgery).
    The harness's own answer to a forgery it finds (the process ends, `forged_word`)
    becomes an exception in its thread: these ranks share the test's process."""
    world = obs.world
    failures: list[BaseException] = []
    links: list[Link] = []
    forged = threading.Event()
    folder = os.path.dirname(on_this_host(cluster.agent_socket(obs.rk.job_dir)))

    def rank_main(rank: int) -> None:
        try:
            link = Link(folder, rank)
            links.append(link)
            calls = Calls(link, StagedHost() if staged else HostBackend(), solution_for(rank))
            if forge == rank:
                link.ctl.set(word, 1)
                link.ring()
                forged.set()
            link.say(phase="loading")
            ctx = SimpleNamespace(rank=rank, world_size=world)
            calls.case(1, {"id": case.id, "args": case.args, "params": case.params}, ctx)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    def found(report, word, k, have):
        raise RuntimeError(f"the harness found its {word!r} word at {have} before call {k}")

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    patched = mock.patch.object(harness, "forged_word", found)
    patched.start()
    for t in threads:
        t.start()
    try:
        if forge is not None and forge >= 0:
            # the forgery comes before the first call is asked for (a rank is up, and its
            # gate may open, once it has its pages: before its thread gets to forge)
            assert forged.wait(60), failures
        obs.connect(ThreadJob(threads))
        try:
            yield links
        finally:
            with contextlib.suppress(JobEnded):
                obs.end(1)
            for t in threads:
                t.join(20)
    finally:
        if not any(t.is_alive() for t in threads):  # (else left on: a live one may find it)
            patched.stop()
        for link in links:
            link.sock.close()
            for fd in (link.bell, link.wake, link.feed):
                os.close(fd)
        if forge is None:
            assert not failures, failures
        assert not any(t.is_alive() for t in threads)


def _case(world: int):
    rng = np.random.default_rng(11)
    op = checks.get("allreduce")
    case = op.make_case(rng, "c0", 1000, "float32", world, {}, 2, 0)
    make_late(case, rng)
    assert [_late(t) for t in case.trials] == [[]] + [[r] for r in range(world)]
    return op, case


def _judge(tmp_path, monkeypatch, kind: str, staged: bool, world: int = 2,
           own: bool = True, scrub: bool = True) -> list[str]:
    op, case = _case(world)
    posts = Posts()
    with through_agent(tmp_path, world, op, staged, monkeypatch,
                       f"job-{kind}-{staged}-{own}-{world}-{scrub}") as (obs, _agent):
        assert set(obs.rk.clock_skew_us()) == {socket.gethostname()}
        if not scrub:
            real_call = obs.call
            obs.call = lambda *a, **kw: real_call(*a, **{**kw, "scrub": False})
        with ranks(obs, case, staged, lambda rank: _allreduce(kind, rank, world, posts)):
            try:
                if own:
                    obs.run_case(case)
                else:
                    obs.case_no += 1
                    for trial in case.trials:
                        obs.call(case, trial, check=True, own_completion=False)
            except WrongAnswer as exc:
                return exc.errors
        assert obs.hosts == [socket.gethostname()] * world
    return []


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_an_honest_solution_passes_the_late_trials_through_an_agent(tmp_path, monkeypatch,
                                                                    staged):
    assert _judge(tmp_path, monkeypatch, "honest", staged) == []


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_drawn_inputs_cross_as_recipes_and_the_agent_draws_them(tmp_path, monkeypatch, staged):
    """No input byte crosses to the agent: every INPUTS frame names its arrays' recipes, and
    the sums the honest all-reduce makes of what the agent drew pass the oracle."""
    sent = []
    real = cluster.RemoteRanks.send

    def send(self, node, kind, header, payload=b""):
        if kind == "INPUTS":
            parts = payload if isinstance(payload, list) else [payload]
            sent.append((header["arrays"], sum(memoryview(p).nbytes for p in parts)))
        return real(self, node, kind, header, payload)

    monkeypatch.setattr(cluster.RemoteRanks, "send", send)
    assert _judge(tmp_path, monkeypatch, "honest", staged) == []
    assert len(sent) >= 2 * 3  # every rank's inputs of every trial
    assert all(n == 0 and meta and all(len(e) == 4 for e in meta) for meta, n in sent), sent
    # an agent whose draws differ from the controller's (another numpy) is sent the bytes
    sent.clear()
    monkeypatch.setattr(cluster.draws, "fingerprint", lambda: "another installation's")
    assert _judge(tmp_path / "bytes", monkeypatch, "honest", staged) == []
    assert sent and all(n > 0 and all(len(e) == 3 for e in meta) for meta, n in sent), sent


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "host"])
def test_outputs_a_peer_completes_later_are_wrong_through_an_agent(tmp_path, monkeypatch,
                                                                   staged):
    """The agent takes each rank's outputs at its own completion (staged: it asks for the
    fetch the moment it sees the rank done), without waiting for the controller."""
    errors = _judge(tmp_path, monkeypatch, "rank0_does_all", staged, scrub=False)
    assert errors and all(m.startswith("[count=1000 float32, trial 1] rank 1: output "
                                       "'recvbuf'") for m in errors), errors
    assert "rank 0 held back 2 ms" in errors[0], errors
    # taken once every rank is done (the controller's COLLECT), the same outputs pass
    assert _judge(tmp_path, monkeypatch, "rank0_does_all", staged, own=False) == []


@pytest.mark.parametrize("word", ["done", "took"])
def test_a_word_the_solution_writes_for_its_harness_is_forbidden_through_an_agent(
        tmp_path, monkeypatch, word):
    op, case = _case(2)
    with through_agent(tmp_path, 2, op, False, monkeypatch, "job-forged") as (obs, _agent):
        def alone(rank):  # (no peer to wait for: rank 1's gate never opens)
            def solution(ctx, sendbuf, recvbuf):
                recvbuf[...] = sendbuf
            return solution

        with ranks(obs, case, False, alone, forge=1, word=word) as links:
            try:
                with pytest.raises(JobEnded) as ended:
                    obs.run_case(case)
            finally:
                for link in links:  # (what the launcher's end of the job does to them)
                    link.ctl.set("end", 1)
    assert ended.value.verdict == "forbidden", ended.value.message
    assert f"rank 1's control page said {word!r} = 1 before the observer asked for gate 1" \
        in ended.value.message


def test_an_agent_that_dies_ends_the_job_as_infra_error(tmp_path, monkeypatch):
    op, case = _case(2)
    with through_agent(tmp_path, 2, op, False, monkeypatch, "job-dies") as (obs, agent):
        released = threading.Event()

        def hang(rank):
            def solution(ctx, sendbuf, recvbuf):
                released.wait(30)
            return solution

        with ranks(obs, case, False, hang, forge=-1) as links:
            agent.send_signal(signal.SIGKILL)
            try:
                with pytest.raises(JobEnded) as ended:
                    obs.run_case(case)
            finally:
                released.set()
                for link in links:  # (what the launcher's end of the job does to them)
                    link.ctl.set("end", 1)
    assert ended.value.verdict == "infra_error"
    assert ended.value.message.startswith("the agent on node ")
    assert "closed the connection" in ended.value.message or "failed" in ended.value.message


def test_the_hub_refuses_a_second_agent_for_a_node(tmp_path, monkeypatch):
    """Only one connection per node is admitted: a second, with the key, is closed."""
    monkeypatch.setenv(cluster.ADDRESS_ENV, "127.0.0.1")
    monkeypatch.delenv(cluster.LISTEN_ENV, raising=False)
    (tmp_path / "ro").mkdir()
    hub = cluster.RemoteRanks(SimpleNamespace(), tmp_path, 2, False, ["a", "b"], "job-2")
    got: list = []

    def agent(node: int) -> None:
        sock = socket.create_connection((hub.address, hub.port), timeout=5)
        ch = wire.Channel(sock, hub.key, "agent", "the controller")
        try:
            got.append(wire.agent_handshake(ch, hub.name, node, {"host": "x"}))
        except wire.WireError as exc:
            got.append(exc)
        finally:
            sock.close()

    try:
        for _ in range(2):
            t = threading.Thread(target=agent, args=(0,))
            t.start()
            deadline = time.monotonic() + 10
            while t.is_alive() and time.monotonic() < deadline:
                hub._admit()
                time.sleep(0.01)
            t.join(5)
    finally:
        hub.close()
    assert isinstance(got[0], dict) and isinstance(got[1], wire.WireError), got
    assert list(hub.agents) == [0]


def test_a_call_not_much_longer_than_the_clocks_uncertainty_is_noisy():
    from pytest_commbench.engine.measure import SKEW_FACTOR, blurred_by_skew

    sizes = [SimpleNamespace(t_ref_us=500.0, t_sol_us=800.0),
             SimpleNamespace(t_ref_us=50_000.0, t_sol_us=40_000.0)]
    assert blurred_by_skew(sizes, {"h1": 500.0 / SKEW_FACTOR + 1, "h2": 3.0})
    assert not blurred_by_skew(sizes, {"h1": 500.0 / SKEW_FACTOR - 1, "h2": 3.0})
    assert not blurred_by_skew(sizes, None) and not blurred_by_skew(sizes, {})
