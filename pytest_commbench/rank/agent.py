"""The node agent: `python -m commbench_rank.agent AGENT.json`, one per node of a job whose
ranks span nodes, started by the launcher before the ranks (docs/cluster-design.md, "Part 2").

It serves its node's ranks on a node-local Unix socket exactly as the observer serves a
single node's (`protocol.Rank`: each rank's control page, data segment, wake-up pipe and feed,
the node's doorbell) and does for them what needs their memory or a clock near them: it
writes each rank's inputs the moment before its gate, sets the words the controller asks for
(refusing, as the observer does, a step whose answer is already there: the solution's
forgery), stamps on its own clock when it set a rank's gate and when it saw its "done", takes
outputs at a rank's own completion or when the controller asks, and reports all of it to the
controller over an authenticated TCP connection (`wire.py`). It decides nothing: the
controller keeps the seed, the oracle and the verdict.

Standard library and numpy only; it never imports the controller (it runs from the job's own
copy of the rank code). It ends its ranks (SIGKILL, by the pids the kernel gave for their
connections) and exits when the controller says STOP, closes the connection or goes silent.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np

from . import draws
from .protocol import Rank, harness_words, on_this_host, socket_address
from .wire import (
    HEARTBEAT_S,
    KEY_ENV,
    Channel,
    WireError,
    agent_handshake,
    pack_arrays,
    unpack_arrays,
)

ANSWERS = ("ready", "took", "done", "saved")
LOOK_S = 0.05  # the loop's longest sleep (the doorbell and the sockets wake it earlier)
CONNECT_S = 10.0


def launcher_rank() -> int:
    """This agent's index among the job's nodes: its rank in the agent step."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID",
                "FLUX_TASK_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    raise RuntimeError("the launcher did not say which node this agent serves")


def peer_pid(conn: socket.socket) -> int:
    """The connected process's pid, as the kernel says (SO_PEERCRED), in this PID namespace."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[0]


def start_time(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat field 22): a pid reused later differs. None
    where the process is no rank harness (its command line does not run `commbench_rank`):
    such a process is never signalled."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"commbench_rank" not in f.read():
                return None
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return stat[stat.rfind(")") + 2:].split()[19]
    except (OSError, IndexError):
        return None


def read_hello(conn: socket.socket) -> tuple[int, str | None] | None:
    """The rank a rank's first line claims and the host it says (None: no claim)."""
    try:
        hello = json.loads(conn.recv(4096).split(b"\n")[0])
        number = int(hello["rank"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    host = hello.get("host") if isinstance(hello, dict) else None
    if not (isinstance(host, str) and 0 < len(host) <= 255 and host.isprintable()):
        host = None
    return number, host


class Agent:
    def __init__(self, spec: dict, key: bytes, node: int) -> None:
        self.spec, self.key, self.node = spec, key, node
        self.job = str(spec["job"])
        self.host = socket.gethostname()
        self.mine = set(int(r) for r in spec["nodes"][node]["ranks"])
        self.path = Path(on_this_host(spec["socket"]))
        self.ranks: dict[int, Rank] = {}
        self.pids: dict[int, tuple[int, str | None]] = {}
        self.seen: dict[int, dict[str, int]] = {}
        self.gone: set[int] = set()
        self.inputs: dict[int, tuple[int, object]] = {}  # rank -> (batch, inputs)
        self.gated: dict[int, int] = {}  # rank -> the call whose gate this agent opened
        self.call: dict = {}
        self.outq: collections.deque = collections.deque()
        self.last_sent = time.monotonic()
        self.bell_r, self.bell_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.server: socket.socket | None = None
        self.pending: list[socket.socket] = []
        self.ch: Channel | None = None

    # -- set-up ----------------------------------------------------------------------------
    def serve(self) -> None:
        """The node-local socket the ranks connect to (a folder of this agent's own)."""
        folder = self.path.parent
        os.makedirs(folder.parent, exist_ok=True)
        os.mkdir(folder, 0o700)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = socket_address(str(folder))
        try:
            self.server.bind(address)
        finally:
            os.close(fd)
        self.server.listen(len(self.mine) + 4)
        self.server.setblocking(False)

    def connect(self) -> dict:
        host, port = self.spec["address"], int(self.spec["port"])
        sock = socket.create_connection((host, port), timeout=CONNECT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ch = Channel(sock, self.key, "agent", "the controller")
        welcome = agent_handshake(self.ch, self.job, self.node,
                                  {"host": self.host, "pid": os.getpid(),
                                   "draws": draws.fingerprint()})
        sock.setblocking(False)
        self.last_sent = time.monotonic()
        return welcome

    # -- frames out ------------------------------------------------------------------------
    def send(self, kind: str, header: dict | None = None, payload=b"") -> None:
        self.outq.extend(memoryview(part) for part in self.ch.frame(kind, header, payload))
        self.last_sent = time.monotonic()
        self.flush()

    def flush(self) -> None:
        """As much of what waits to go out as the socket takes now (never blocking: the
        controller may be sending while this agent sends)."""
        sock = self.ch.sock
        while self.outq:
            head = self.outq[0]
            try:
                n = sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            if n < len(head):
                self.outq[0] = head[n:]
                return
            self.outq.popleft()

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> str:
        """Serve until the controller says STOP or is gone; returns why it ended."""
        for kind, header, payload in self.ch.backlog:  # read along with the WELCOME
            why = self.handle(kind, header, payload)
            if why:
                return why
        self.ch.backlog = []
        while True:
            reads = [self.ch.sock, self.bell_r, *self.pending,
                     *(r.conn for n, r in self.ranks.items() if n not in self.gone)]
            if self.server is not None:
                reads.append(self.server)
            writes = [self.ch.sock] if self.outq else []
            ready, writable, _ = select.select(reads, writes, [], LOOK_S)
            if self.ch.sock in writable:
                self.flush()
            if self.ch.sock in ready:
                for kind, header, payload in self.ch.receive(1 << 22):
                    why = self.handle(kind, header, payload)
                    if why:
                        return why
            if self.server is not None and self.server in ready:
                self.accept()
            greeted = [c for c in self.pending if c in ready]
            for conn in greeted:
                self.pending.remove(conn)
                self.greet(conn)
            for number, rank in list(self.ranks.items()):
                if number not in self.gone and rank.conn in ready and rank.conn not in greeted:
                    self.listen(number, rank)
            if self.bell_r in ready:
                try:
                    while os.read(self.bell_r, 65536):
                        pass
                except BlockingIOError:
                    pass
            self.look()
            if time.monotonic() - self.last_sent >= HEARTBEAT_S:
                self.send("HEARTBEAT", {"t": time.monotonic()})
            if self.ch.silent():
                return "the controller went silent"

    def accept(self) -> None:
        try:
            conn, _ = self.server.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(10)
        self.pending.append(conn)

    def greet(self, conn: socket.socket) -> None:
        """A rank's hello: a rank of this node claimed once gets its pages; a claim for a
        rank of another node is reported (where it landed) and refused, a second claim
        refused."""
        hello = read_hello(conn)
        if hello is None:
            conn.close()
            return
        number, said = hello
        if number not in self.mine:
            self.send("STRAY", {"rank": number, "host": self.host})
            conn.close()
            return
        if number in self.ranks:
            conn.close()  # a second claim to a rank is never believed
            return
        pid = peer_pid(conn)
        rank = Rank.greeted(conn, number, self.bell_w)
        self.ranks[number] = rank
        self.pids[number] = (pid, start_time(pid))
        self.seen[number] = {w: 0 for w in ANSWERS}
        self.send("RANK_UP", {"rank": number, "pid": pid, "host": self.host, "said": said,
                              "feed_bytes": rank.feed_bytes})

    def listen(self, number: int, rank: Rank) -> None:
        """What a rank said on its socket: "loading" and "raised" go to the controller."""
        try:
            data = rank.conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return  # nothing yet
        except OSError:
            data = b""
        if not data:
            self.gone.add(number)
            self.send("GONE", {"rank": number})
            return
        _n, messages = rank.read()
        for msg in messages:
            if isinstance(msg, dict) and (msg.get("phase") == "loading" or msg.get("raised")):
                self.send("WORD", {"rank": number, "phase": msg.get("phase"),
                                   "raised": bool(msg.get("raised"))})

    def look(self) -> None:
        """Every answer word that changed since the last look, stamped now; at a rank's own
        completion (a call that takes it), its fetch asked or its outputs taken."""
        call = self.call
        for number, rank in self.ranks.items():
            seen = self.seen[number]
            for word in ANSWERS:
                value = rank.ctl.get(word)
                if value == seen[word]:
                    continue
                seen[word] = value
                t = time.monotonic()
                self.send("SEEN", {"rank": number, "word": word, "value": value, "t": t})
                k = call.get("k", 0)
                if not call.get("own") or value < k or self.gated.get(number) != k:
                    continue
                if word == "done" and call.get("staged"):
                    self.ask(number, "fetch", k)  # its outputs now, not once all are done
                elif (word == "done" and not call.get("staged")) or word == "saved":
                    if call.get("check"):
                        self.outputs(number, k, "own")

    # -- the controller's frames -----------------------------------------------------------
    def handle(self, kind: str, header: dict, payload: bytes) -> str | None:
        if kind == "SYNC":
            self.send("SYNC_REPLY", {"t0": header.get("t0"), "ta": time.monotonic()})
        elif kind == "LAYOUT":
            rank = self.ranks[int(header["rank"])]
            rank.describe(header["placed"], int(header["size"]), header["feed"],
                          header["info"], int(header["version"]))
        elif kind == "INPUTS":
            # (a drawn array's recipe is drawn here, before its rank is asked for the call)
            self.inputs[int(header["rank"])] = (int(header.get("batch", 1)),
                                                unpack_arrays(header["arrays"], payload))
        elif kind == "CALL":
            self.call = header
        elif kind == "SET":
            number, word, value = int(header["rank"]), str(header["word"]), int(header["value"])
            if header.get("step"):
                self.ask(number, word, value)
            else:
                self.ranks[number].set(word, value)
        elif kind == "COLLECT":
            for number in sorted(self.ranks):
                self.outputs(number, int(header["k"]), "all")
        elif kind == "STOP":
            return "the controller said STOP"
        return None

    def ask(self, number: int, step: str, k: int) -> None:
        """Ask rank `number` for step k ("prep", "gate", "fetch"), its inputs written just
        before; an answer already at k is the solution's forgery (FORGED, nothing set)."""
        rank = self.ranks[number]
        for word in harness_words(step):
            have = rank.ctl.get(word)
            if have >= k:
                self.send("FORGED", {"rank": number, "word": word, "have": have,
                                     "step": step, "k": k})
                return
        if number in self.inputs and step in ("prep", "gate"):
            batch, inputs = self.inputs.pop(number)
            if batch > 1:  # a batch: every call's inputs in order into the rank's feed
                rank.feed(b"".join(np.ascontiguousarray(a).tobytes() for _n, a in inputs))
            else:
                rank.put(inputs)
        rank.set(step, k)
        if step == "gate":
            self.gated[number] = k
        self.send("SEEN", {"rank": number, "word": step, "value": k, "t": time.monotonic()})

    def outputs(self, number: int, k: int, taken: str) -> None:
        """A copy of the rank's outputs as they are now, sent (every buffer set's)."""
        rank = self.ranks[number]
        from .protocol import views

        v = views(rank.data, rank.placed)
        # (copied now: what the rank writes after this moment is not in them)
        meta, payload = pack_arrays([(e[0], np.array(v[e[0]])) for e in rank.placed
                                     if e[1] == "out"])
        self.send("OUTPUTS", {"rank": number, "k": k, "taken": taken, "arrays": meta}, payload)

    # -- the end ---------------------------------------------------------------------------
    def end(self) -> None:
        """Every rank of this node that is still there killed; the node's socket removed."""
        for pid, started in self.pids.values():
            if started is not None and start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for rank in self.ranks.values():
            rank.close()
        if self.server is not None:
            self.server.close()
        try:
            (self.path.parent / self.path.name).unlink(missing_ok=True)
            os.rmdir(self.path.parent)
        except OSError:
            pass
        if self.ch is not None:
            try:
                self.ch.sock.setblocking(True)
                self.ch.sock.settimeout(1.0)
                while self.outq:
                    self.ch.sock.sendall(self.outq.popleft())
            except OSError:
                pass
            self.ch.close()


def main(argv: list[str]) -> int:
    key_hex = os.environ.pop(KEY_ENV, "")
    try:
        spec = json.loads(Path(argv[0]).read_text())
        key = bytes.fromhex(key_hex)
        node = launcher_rank()
    except (OSError, ValueError, IndexError, RuntimeError) as exc:
        sys.stderr.write(f"[commbench agent] cannot start: {exc}\n")
        return 2
    agent = Agent(spec, key, node)
    # the launcher ends its step with SIGTERM first: the ranks and the node's socket go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = "?"
    try:
        agent.connect()  # first: the controller learns where this agent landed, whatever
        try:
            agent.serve()
        except OSError as exc:
            agent.send("ERROR", {"why": f"the node's socket could not be made: {exc}"})
            raise
        why = agent.run()
        code = 0
    except WireError as exc:
        why, code = str(exc), 3
    except Exception as exc:  # noqa: BLE001 - said, and the ranks still ended below
        why, code = f"{type(exc).__name__}: {exc}", 4
    finally:
        agent.end()
    if code:
        sys.stderr.write(f"[commbench agent {agent.host}] ended: {why}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
