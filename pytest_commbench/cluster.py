"""The ranks of a job over several nodes (`RemoteRanks`): the controller's hub of the node
agents (`rank/agent.py`), one per node, each serving its node's ranks as `LocalRanks` serves
one node's. docs/cluster-design.md, "Part 2: the observer across nodes".

The hub listens on a TCP port of an address the agents reach, accepts only as many
connections as the job has nodes, each authenticated within `wire.AUTH_S` by the job's key
(made here, per job, handed to the agent step's environment alone), measures each agent's
clock offset (the best of `SYNC_ROUNDS` exchanges) and then turns the observer's calls into
frames: each rank's layout (LAYOUT), inputs (INPUTS, written by the agent the moment before
that rank's gate), its steps (SET), and back the words the agent saw with the time it saw
them on its own clock (SEEN), the outputs (OUTPUTS), a forged answer (FORGED), the ranks'
"loading" and "raised" (WORD). A call's time is the longest of the ranks' done - gate, each
taken on one node's clock. An agent that ends, or goes silent, ends the job: `infra_error`.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import nodes
from .checks.base import Trial
from .observer_call import Call, JobEnded
from .observer_checks import spot_check
from .observer_phases import Timing
from .observer_wire import call_info, input_arrays
from .rank import draws, wire
from .rank.protocol import SOCKET, STEP_ANSWER, STEP_BEGUN, WORDS, views
from .verdicts import Verdict

# "done" answers "gate", ...; "took" begins the gate's call
ASKED = {**{answer: step for step, answer in STEP_ANSWER.items()},
         **{begun: step for step, begun in STEP_BEGUN.items()}}
SYNC_ROUNDS = 32  # clock exchanges per agent; the one with the shortest round trip counts
SEND_S = 30.0  # a send an agent does not take in this long: the agent is gone
AGENT_FILE = "agent.json"  # in the job's ro/: what the agents are told
#: where the controller's listening socket is made (a command, given a Unix socket's path and
#: the address to bind, that sends back a listening TCP socket: simulated hosts, whose
#: network the controller is outside of); unset: bound here
LISTEN_ENV = "COMMBENCH_AGENT_LISTEN"
#: the address the agents connect to (default: this host's name's first non-loopback address)
ADDRESS_ENV = "COMMBENCH_AGENT_ADDRESS"


def job_name(job_dir: Path) -> str:
    """A job's name among the agents: its folder's and a random part (two controllers'
    jobs of one name never share a node's socket)."""
    return f"{job_dir.name[:40]}-{os.urandom(6).hex()}"


def agent_socket(job_dir: Path | str) -> str:
    """Where a job's agent serves its node's ranks: a socket in a folder of the job's own
    folder named by the node's short host name (`{host}`, filled in by the agent and by each
    rank alike: `protocol.on_this_host`). In the job's folder, each node's sandbox has it
    in view as it has the rest of the job; a socket is an object of the kernel that made it,
    so a rank reaches only its own node's agent (one kernel, as on simulated hosts: the agent
    refuses a rank of another node)."""
    return f"{Path(job_dir).resolve()}/agents/{{host}}/{SOCKET}"


class Mirror:
    """A remote rank's control words as the controller last heard them."""

    def __init__(self) -> None:
        self.words = dict.fromkeys(WORDS, 0)

    def get(self, name: str) -> int:
        return self.words[name]

    def set(self, name: str, value: int) -> None:
        self.words[name] = value


@dataclass
class RemoteRank:
    """A rank on a node agent's side: the words it set (as heard), its layout, its outputs
    as last collected (a segment rebuilt from them, as `LocalRanks` reads its own)."""

    number: int
    node: int
    hub: RemoteRanks
    feed_bytes: int
    ctl: Mirror = field(default_factory=Mirror)
    placed: list = field(default_factory=list)
    fed: list = field(default_factory=list)
    size: int = 0
    data: bytearray | None = None

    def set(self, word: str, value: int) -> None:
        self.ctl.set(word, value)
        self.hub.send(self.node, "SET", {"rank": self.number, "word": word, "value": value})


@dataclass
class AgentLink:
    node: int
    host: str
    ch: wire.Channel
    offset: float = 0.0  # agent clock - controller clock
    skew: float = 0.0  # the offset's uncertainty (half the best round trip)
    # whether the agent draws what this controller draws from a recipe (the same numpy):
    # else its ranks' inputs go as bytes
    recipes: bool = False


def agent_address() -> str:
    """The address agents connect to (ADDRESS_ENV, else this host name's address)."""
    given = os.environ.get(ADDRESS_ENV)
    if given:
        return given
    name = socket.gethostname()
    for family, _t, _p, _c, addr in socket.getaddrinfo(name, None, socket.AF_INET):
        if family == socket.AF_INET and not addr[0].startswith("127."):
            return addr[0]
    return name


def listen(address: str, folder: Path) -> socket.socket:
    """A listening TCP socket on an ephemeral port of `address` (LISTEN_ENV: made by that
    command, in the network the agents are on, and sent back over a Unix socket in
    `folder`)."""
    via = os.environ.get(LISTEN_ENV)
    if not via:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind((address, 0))
        server.listen(16)
        return server
    import shlex

    from .rank.protocol import socket_address

    path = folder / "listen.sock"
    path.unlink(missing_ok=True)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        bound, fd = socket_address(str(folder))  # (a short address for a long path)
        try:
            unix.bind(bound.replace(SOCKET, path.name))
        finally:
            os.close(fd)
        unix.listen(1)
        unix.settimeout(30)
        helper = subprocess.Popen([*shlex.split(via), str(path), address],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        try:
            conn, _ = unix.accept()
        except OSError:
            helper.kill()
            _out, err = helper.communicate(timeout=10)
            raise RuntimeError(f"the listening socket was not made ({LISTEN_ENV}): "
                               f"{err.decode(errors='replace')[-500:]}") from None
        with conn:
            _msg, fds, _f, _a = socket.recv_fds(conn, 64, 1)
        helper.wait(timeout=30)
        if not fds:
            raise RuntimeError(f"the listening socket was not made ({LISTEN_ENV})")
        return socket.socket(fileno=fds[0])
    finally:
        unix.close()
        path.unlink(missing_ok=True)


class RemoteRanks:
    """The hub: a job's ranks through their nodes' agents (see the module)."""

    def __init__(self, obs, job_dir: Path, world: int, staged: bool,
                 layout: list[str], name: str) -> None:
        self.obs, self.world, self.staged = obs, world, staged
        self.job_dir = job_dir
        self.layout = list(layout)
        self.nodes = list(dict.fromkeys(layout))
        self.node_of = [self.nodes.index(n) for n in layout]
        self.key = wire.make_key()
        self.name = name
        self.address = agent_address()
        self.server = listen(self.address, job_dir)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.agents: dict[int, AgentLink] = {}
        self.ranks: list[RemoteRank | None] = [None] * world
        self.hosts: list[str | None] = [None] * world
        self.stamps: dict[tuple[int, str, int], float] = {}
        self.taken: dict[tuple[int, int, str], list] = {}
        self.broken: str | None = None  # why an agent is gone (the job's end, infra_error)
        self.failure: JobEnded | None = None  # what an agent found (a forged word)
        self.stray: list[tuple[int, str]] = []
        self.agent_job = None
        self.job = None
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    # -- the agent step ----------------------------------------------------------------------
    def agent_spec(self) -> dict:
        """What every agent is told (AGENT_FILE): the controller's address, the job's name,
        each node's ranks, the node-local path of the socket its ranks connect to."""
        return {"job": self.name, "address": self.address, "port": self.port,
                "socket": agent_socket(self.job_dir),
                "nodes": [{"host": n, "ranks": [r for r in range(self.world)
                                                if self.layout[r] == n]} for n in self.nodes]}

    def write_spec(self) -> Path:
        path = self.job_dir / "ro" / AGENT_FILE
        path.write_text(json.dumps(self.agent_spec()))
        return path

    def agent_env(self) -> dict[str, str]:
        return {wire.KEY_ENV: self.key.hex()}

    def meet_agents(self, agent_job, deadline: float) -> None:
        """Accept and authenticate one agent per node (others closed unread), measure each
        one's clock; the listener is closed once they are in. JobEnded (infra_error) where
        they are not all in by `deadline` (monotonic) or their step ended."""
        self.agent_job = agent_job
        while len(self.agents) < len(self.nodes):
            if time.monotonic() > deadline or not agent_job.alive():
                why = ("ended" if not agent_job.alive() else
                       "did not all connect in time")
                missing = [self.nodes[i] for i in range(len(self.nodes))
                           if i not in self.agents]
                raise JobEnded(Verdict.INFRA_ERROR,
                               f"the node agents {why} (missing: {', '.join(missing)})")
            ready, _, _ = select.select([self.server], [], [], 0.05)
            if ready:
                self._admit()
        self.server.close()
        # where the agents landed is where the launcher puts the ranks: a node named twice
        # (a name and an address of one host) is one node to the launcher
        landed = [self.agents[self.node_of[r]].host or None for r in range(self.world)]
        wrong = nodes.misplaced(self.layout, landed)
        if wrong:
            self.hosts[:] = landed
            raise JobEnded(Verdict.INFRA_ERROR, wrong)
        for link in self.agents.values():
            try:
                self._sync(link)
            except wire.WireError as exc:
                raise JobEnded(Verdict.INFRA_ERROR, f"the agent on node "
                               f"{self.nodes[link.node]} ended ({exc})") from None
        self._beats = threading.Thread(target=self._beat, name="commbench-agents",
                                       daemon=True)
        self._beats.start()

    def _admit(self) -> None:
        try:
            conn, peer = self.server.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(SEND_S)  # a send to an agent that takes nothing for this long fails
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ch = wire.Channel(conn, self.key, "controller", f"a connection from {peer[0]}")
        try:
            hello = wire.controller_handshake(ch, self.name, len(self.nodes))
            node = hello["node"]
            if node in self.agents:
                raise wire.WireError(f"a second agent for node {self.nodes[node]}")
            wire.welcome(ch, hello, node_seed=node, ranks=[
                r for r in range(self.world) if self.node_of[r] == node])
        except wire.WireError:
            ch.close()  # closed unread: nothing it said counts
            return
        ch.peer = f"the agent on node {self.nodes[node]}"
        self.agents[node] = AgentLink(node, str(hello.get("host", "")), ch,
                                      recipes=hello.get("draws") == draws.fingerprint())

    def _sync(self, link: AgentLink) -> None:
        samples = []
        for _ in range(SYNC_ROUNDS):
            t0 = time.monotonic()
            link.ch.send("SYNC", {"t0": t0})
            kind, header, _ = link.ch.recv(wire.HEARTBEAT_S * wire.SILENCE_BEATS)
            t1 = time.monotonic()
            if kind == "ERROR":
                raise JobEnded(Verdict.INFRA_ERROR, f"the agent on node "
                               f"{self.nodes[link.node]} ended ({header.get('why')})")
            if kind != "SYNC_REPLY" or header.get("t0") != t0:
                raise JobEnded(Verdict.INFRA_ERROR,
                               f"{link.ch.peer} answered SYNC with {kind}")
            samples.append((t0, float(header["ta"]), t1))
        link.offset, link.skew = wire.best_offset(samples)

    def _beat(self) -> None:
        """Heartbeats to every agent while the job lasts (a thread: the controller's own
        work, an oracle of a large case, may keep it from the wire for seconds)."""
        while not self._stop.wait(wire.HEARTBEAT_S / 2):
            for link in list(self.agents.values()):
                try:
                    link.ch.beat()
                except wire.WireError:
                    pass

    def clock_skew_us(self) -> dict[str, float]:
        """Each node's clock offset's uncertainty, microseconds."""
        return {self.nodes[n]: round(link.skew * 1e6, 3) for n, link in self.agents.items()}

    # -- frames ------------------------------------------------------------------------------
    def send(self, node: int, kind: str, header: dict, payload=b"") -> None:
        link = self.agents[node]
        try:
            link.ch.send(kind, header, payload)
        except wire.WireError as exc:
            self._lost(link, str(exc))
            self.check()

    def _lost(self, link: AgentLink, why: str) -> None:
        why = why.replace(f"{link.ch.peer} ", "")
        if self.broken is None:
            self.broken = f"the agent on node {self.nodes[link.node]} ended ({why})"

    def read_sockets(self) -> int:
        """Read what the agents sent (one read each); returns the bytes read."""
        socks = {link.ch.sock: link for link in self.agents.values() if not link.ch.closed}
        if not socks:
            return 0
        try:
            ready, _, _ = select.select(list(socks), [], [], 0)
        except (OSError, ValueError):
            ready = []
        # frames already read (along with the last clock exchange's) come first
        ready = list(ready) + [s for s, link in socks.items() if link.ch.backlog and s not in ready]
        got = 0
        for sock in ready:
            link = socks[sock]
            before = len(link.ch.buf)
            try:
                frames = link.ch.receive(1 << 22)
            except wire.WireError as exc:
                self._lost(link, str(exc))
                link.ch.close()
                continue
            got += max(len(link.ch.buf) - before, 1) + len(frames)
            for kind, header, payload in frames:
                self._heard(link, kind, header, payload)
        for link in self.agents.values():
            if not link.ch.closed and link.ch.silent():
                self._lost(link, "nothing heard from it for "
                                 f"{wire.HEARTBEAT_S * wire.SILENCE_BEATS:g} s")
        if self.agent_job is not None and not self.agent_job.alive() and self.broken is None \
                and not self._stop.is_set():
            self.broken = "the node agents' launch step ended"
        return got

    def _heard(self, link: AgentLink, kind: str, h: dict, payload: bytes) -> None:
        try:
            number = int(h.get("rank", -1))
        except (TypeError, ValueError):
            return
        if kind not in ("STRAY", "ERROR") and not (0 <= number < self.world
                                    and self.node_of[number] == link.node):
            return  # an agent speaks for its own node's ranks only
        if kind == "RANK_UP":
            if self.ranks[number] is None:
                self.ranks[number] = RemoteRank(number, link.node, self,
                                                int(h.get("feed_bytes", 1 << 16)))
                self.hosts[number] = str(h.get("host") or link.host)
        elif kind == "SEEN":
            rank = self.ranks[number]
            word, value = str(h.get("word")), int(h.get("value", 0))
            if rank is not None and word in rank.ctl.words:
                rank.ctl.words[word] = max(rank.ctl.words[word], value)
                self.stamps[(number, word, value)] = float(h.get("t", 0.0))
        elif kind == "WORD":
            rank = self.ranks[number]
            if rank is not None:
                msg = {"phase": h.get("phase")} if h.get("phase") else {}
                if h.get("raised"):
                    msg["raised"] = True
                self.obs._heard(rank, msg)
        elif kind == "OUTPUTS":
            try:
                self.taken[(number, int(h["k"]), str(h["taken"]))] = wire.unpack_arrays(
                    h["arrays"], payload)
            except (KeyError, ValueError, wire.WireError) as exc:
                self.broken = f"the agent on node {self.nodes[link.node]} sent outputs " \
                              f"that could not be read ({exc})"
        elif kind == "FORGED" and self.failure is None:
            self.failure = JobEnded(
                Verdict.FORBIDDEN,
                f"rank {number}'s control page said {h.get('word')!r} = {h.get('have')} "
                f"before the observer asked for {h.get('step')} {h.get('k')}: the solution "
                "wrote its harness's word (a completion the harness did not see is no "
                "completion)")
        elif kind == "ERROR":
            self._lost(link, str(h.get("why", "it failed")))
        elif kind == "STRAY":
            self.stray.append((number, str(h.get("host"))))

    def check(self) -> None:
        """Raise what the agents' frames decided: an agent gone (infra_error), a forged
        word (forbidden)."""
        if self.broken is not None:
            raise JobEnded(Verdict.INFRA_ERROR, self.broken)
        if self.failure is not None:
            raise self.failure

    def wait(self, timeout: float) -> None:
        socks = [link.ch.sock for link in self.agents.values() if not link.ch.closed]
        if socks:
            try:
                select.select(socks, [], [], timeout)
            except (OSError, ValueError):
                time.sleep(timeout)
        else:
            time.sleep(timeout)
        self.read_sockets()

    # -- the job -----------------------------------------------------------------------------
    def connect(self, job) -> None:
        """Until every rank has reached its node's agent."""
        self.job = self.obs.job = job
        while any(r is None for r in self.ranks):
            self.wait(0.01)
            self.check()
            if self.stray:
                number, host = self.stray[0]
                raise JobEnded(Verdict.INFRA_ERROR,
                               f"the ranks did not land where the launcher was asked to put "
                               f"them: rank {number} ran on {host} (asked: "
                               f"{self.layout[number]})")
            if any(r is None for r in self.ranks) and (job.overdue() or not job.alive()):
                job.timed_out = job.overdue()
                missing = [i for i, r in enumerate(self.ranks) if r is None]
                raise JobEnded(Verdict.INFRA_ERROR,
                               f"ranks {missing} never reached the observer (their nodes' "
                               "agents)")

    def describe(self, number: int, placed: list, size: int, feed: list,
                 trials: list[Trial], holds: list | None, scrub: bool, version: int) -> None:
        rank = self.ranks[number]
        rank.placed, rank.fed, rank.size = placed, feed, size
        self.send(rank.node, "LAYOUT", {
            "rank": number, "placed": placed, "size": size, "feed": feed, "version": version,
            "info": call_info(number, trials, feed, holds, scrub)})

    def _inputs(self, i: int, trials: list[Trial]) -> None:
        """Rank i's inputs of this call to its agent: a drawn array as its recipe (the agent
        draws it: `rank/draws.py`), any other as its bytes."""
        meta, parts = wire.pack_arrays(input_arrays(i, trials),
                                       recipes=self.agents[self.node_of[i]].recipes)
        self.send(self.node_of[i], "INPUTS", {"rank": i, "batch": len(trials), "arrays": meta},
                  parts)

    def _ask(self, i: int, step: str, k: int) -> None:
        self.ranks[i].ctl.set(step, k)
        self.send(self.node_of[i], "SET", {"rank": i, "word": step, "value": k, "step": True})

    def _has(self, i: int, word: str, k: int) -> bool:
        """Whether rank i's answer `word` reached k after its agent set the step it answers
        (an answer there before its step is the solution's, which the agent reports as
        FORGED instead of setting the step)."""
        return self.ranks[i].ctl.get(word) >= k and (i, ASKED[word], k) in self.stamps

    def _t(self, i: int, word: str, k: int) -> float:
        """When rank i's `word` reached k, on its agent's clock."""
        return self.stamps.get((i, word, k), 0.0)

    def run(self, c: Call, wants: list, slacks: list) -> list[str]:
        """Call `c` through the agents (see `LocalRanks.run`, whose steps these are)."""
        k, n = c.k, self.world
        for node in self.agents:
            self.send(node, "CALL", {"k": k, "own": c.own, "staged": self.staged,
                                     "check": c.check})
        spin = self.obs._spin
        on_time = [i for i in c.order if i not in c.late]
        if self.staged:
            for i in on_time:
                self._inputs(i, c.trials)
                self._ask(i, "prep", k)
            spin(lambda: all(self._has(i, "ready", k) for i in on_time))
            c.before = max((self._t(i, "ready", k) - self._t(i, "prep", k) for i in on_time),
                           default=0.0)
        start, waited = time.perf_counter(), False
        for i in c.order:
            if c.trial.delays[i] > 0 and not waited:
                # a late rank's delay counts from when every rank on time began its call
                # (protocol.py), as its agent saw it
                early = [j for j in c.order if not c.trial.delays[j]]
                spin(lambda early=early: all(self._has(j, "took", k) for j in early))
                start, waited = time.perf_counter(), True
            at = start + c.trial.delays[i]
            while time.perf_counter() < at:
                self.wait(min(0.001, max(at - time.perf_counter(), 0.0)))
                self.check()
            if not self.staged or i in c.late:
                self._inputs(i, c.trials)
            if i in c.late:
                self._ask(i, "prep", k)
            self._ask(i, "gate", k)
        if c.own:
            # the agents ask a staged rank for its outputs the moment they see it done and
            # take them the moment it saved them (host: the moment it is done)
            last = "saved" if self.staged else "done"
            spin(lambda: all(self._has(i, last, k) for i in range(n)) and (
                not c.check or all((i, k, "own") in self.taken for i in range(n))))
            if self.staged:
                c.after = max(self._t(i, "saved", k) - self._t(i, "fetch", k)
                              for i in range(n))
            if c.check:
                for i in range(n):
                    c.taken[i] = {name: np.array(a) for name, a in self.taken.pop((i, k, "own"))
                                  if name in c.trial.outputs[i]}
        else:
            spin(lambda: all(self._has(i, "done", k) for i in range(n)))
            if self.staged:
                for i in range(n):
                    self._ask(i, "fetch", k)
                spin(lambda: all(self._has(i, "saved", k) for i in range(n)))
                c.after = max(self._t(i, "saved", k) - self._t(i, "fetch", k)
                              for i in range(n))
            if c.check:
                self._collect(k)
        self.check()  # what the agents found (a forged word) before any output is judged
        self._times(c)
        if c.check and not self.staged and not c.own:
            return self._spot_checks(c, wants, slacks)
        return []

    def _collect(self, k: int) -> None:
        """Every rank's outputs as they are now (each agent copies its ranks' when asked),
        into a segment of the controller's own per rank."""
        for node in self.agents:
            self.send(node, "COLLECT", {"k": k})
        self.obs._spin(lambda: all((i, k, "all") in self.taken for i in range(self.world)))
        for i, rank in enumerate(self.ranks):
            arrays = dict(self.taken.pop((i, k, "all")))
            seg = bytearray(max(rank.size, 1))
            target = views(seg, rank.placed)
            for name, kind, _shape, _dtype, _off in rank.placed:
                if kind == "out" and name in arrays:
                    target[name][...] = arrays[name]
            rank.data = seg

    def _times(self, c: Call) -> None:
        """Each rank's gate and done on the controller's clock (each agent's offset taken
        off: what an oracle compares across ranks), kept on their own clocks for the call's
        time (`timing`)."""
        c.agent_gate = [self._t(i, "gate", c.k) for i in range(self.world)]
        c.agent_done = [self._t(i, "done", c.k) for i in range(self.world)]
        for i in range(self.world):
            off = self.agents[self.node_of[i]].offset
            c.gate[i] = c.agent_gate[i] - off
            c.done[i] = c.agent_done[i] - off

    def _spot_checks(self, c: Call, wants: list, slacks: list) -> list[str]:
        obs, early = self.obs, []
        for i in range(self.world):
            for j, (want, slack) in enumerate(zip(wants, slacks)):
                if want is not None:
                    early.extend(spot_check(self.ranks[i], want[i], slack[i] if slack else {},
                                            obs.rng, obs.op.exact, obs.s.rtol, obs.s.atol,
                                            j, c.batch))
        return early

    def timing(self, c: Call) -> Timing:
        """The call's time: the longest of the ranks' done - gate, each on its node's clock
        (no offset in it), over the batch's size; the untimed phases likewise."""
        call = max(d - g for d, g in zip(c.agent_done, c.agent_gate))
        return Timing(call / c.batch, c.before / c.batch, c.after / c.batch)

    def outputs(self, c: Call, j: int) -> list[dict[str, np.ndarray]]:
        from .observer_wire import call_outputs

        if c.own:
            return list(c.taken)
        return call_outputs(self.ranks, c.trials[j], j, c.batch)

    def stop(self) -> None:
        """STOP to every agent (they end their ranks and exit)."""
        self._stop.set()
        for link in self.agents.values():
            if not link.ch.closed:
                try:
                    link.ch.send("STOP", {})
                except wire.WireError:
                    pass

    def close(self) -> None:
        self.stop()
        if self._beats is not None:
            self._beats.join(5)
        for link in self.agents.values():
            link.ch.close()
        try:
            self.server.close()
        except OSError:
            pass
