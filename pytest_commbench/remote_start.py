"""The launcher's remote start for a sandboxed job over nodes (Open MPI's mpirun); standard
library only, run as a script in two roles.

A job whose ranks span nodes runs in one sandbox per node, each as a job on one node runs in
its own (`sandbox_init.py`: the same view, the same limits, per node). On the launcher's node
the sandbox holds mpirun and that node's ranks; on every other node it holds the launcher's
daemon (ORTE's orted, PRRTE's prted) and that node's ranks. A process inside a sandbox cannot
start anything on another node (ssh's keys, a cluster's remote-start agent and its namespaces
are outside it), so mpirun's remote-start agent is this file's client, and the start itself is
made outside by this file's broker:

- `python -I -S remote_start.py serve CONFIG -- ARGV...` (the broker): the job's first
  process, outside every sandbox, on the controller's node. It listens on the job's socket
  (CONFIG's `socket`, in the job's folder), runs ARGV (the launcher's node's sandbox) and,
  for each request of the client, runs the launcher's own remote-start agent (CONFIG's
  `agent`: ssh, or the simulated hosts' agent) as `AGENT NODE SANDBOX @PLAN -- /bin/sh -c
  COMMAND`: the daemon's command inside a sandbox of that node, built from that node's plan
  (a file the controller wrote in the job's read-only folder). Each node of CONFIG's `nodes`
  is started once, and the socket is closed once every one was: mpirun starts all its daemons
  before any rank (no tree spawn: the daemons start none themselves), so no rank ever finds
  it open (and the controller, once every rank reached it, tells the broker to close it
  whatever node was not asked for: `SIGUSR1`). The broker ends with the launcher's node's sandbox, with its status (its signal
  too); the remote sandboxes then lose their lifeline and end.
- `python -I -S ro/remote_start.py start NODE WORDS...` (the client, mpirun's
  `plm_rsh_agent` / `plm_ssh_agent`, inside the sandbox): says NODE and the command (its
  words joined as ssh joins them) to the broker, hands it its standard output and error (the
  daemon writes to them as through ssh), and ends with the remote command's status; when it
  is killed (mpirun gives up on a daemon), the broker ends that node's sandbox.

A remote sandbox lives while its standard input is open (`lifeline` in its plan): the broker
holds the other end, as ssh holds a session; it ends when the broker does, whichever way
(the controller's death, the job's deadline, the job's end).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time

CONFIG = "remote-start.json"  # beside the client, in the job's read-only folder
REQUEST_BYTES = 1 << 18  # a request (a daemon's command) is at most this large
REQUEST_S = 2.0  # a connection must say its request within this time
STOP_S = 5.0  # a remote sandbox has this long to end once its lifeline is cut
TICK_S = 0.05
PR_SET_PDEATHSIG = 1
LIMIT_EXIT = 122  # sandbox_init's: a sandbox stopped its job at one of its limits


def _address(path: str) -> tuple[int, str]:
    """(a descriptor of the socket's folder, an address through it): a job's folder may be
    deeper than a Unix socket's address allows (108 bytes)."""
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return folder, f"/proc/self/fd/{folder}/{os.path.basename(path)}"


def _die_with_parent() -> None:  # pragma: no cover - in the child
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _status(code: int) -> int:
    return code if code >= 0 else 128 - code


# -- the client (inside the launcher's sandbox) ------------------------------------------------

def start(args: list[str]) -> int:
    while args and args[0].startswith("-"):  # ssh's options: none has a meaning here
        args = args[1:]
    if len(args) < 2:
        sys.stderr.write("usage: remote_start.py start NODE COMMAND...\n")
        return 255
    node, command = args[0], " ".join(args[1:])
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, CONFIG)) as f:
            config = json.load(f)
        folder, address = _address(config["socket"])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        os.close(folder)
        request = json.dumps({"node": node, "command": command}).encode() + b"\n"
        socket.send_fds(sock, [request], [1, 2])
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"[commbench remote start] {node}: {exc}\n")
        return 255
    word, _, rest = reply.decode(errors="replace").strip().partition(" ")
    if word == "EXIT" and rest.lstrip("-").isdigit():
        return int(rest)
    sys.stderr.write(f"[commbench remote start] {node}: "
                     f"{rest if word == 'REFUSED' else 'the broker ended'}\n")
    return 255


# -- the broker (outside every sandbox) -------------------------------------------------------

class Remote:
    """One node's remote start: the agent's process, its lifeline, the client's connection."""

    def __init__(self, node: str, conn: socket.socket, proc: subprocess.Popen,
                 lifeline: int) -> None:
        self.node, self.conn, self.proc, self.lifeline = node, conn, proc, lifeline

    def cut(self) -> None:
        if self.lifeline >= 0:
            os.close(self.lifeline)
            self.lifeline = -1

    def close(self, code: int | None) -> None:
        """The client is told the remote command's status (None: it is gone)."""
        self.cut()
        if self.conn is not None:
            if code is not None:
                try:
                    self.conn.sendall(f"EXIT {code}\n".encode())
                except OSError:
                    pass
            self.conn.close()
            self.conn = None


def _request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(REQUEST_S)
    data, fds, _flags, _addr = socket.recv_fds(conn, REQUEST_BYTES, 2)
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(REQUEST_BYTES)
            if not chunk or len(data) + len(chunk) > REQUEST_BYTES:
                raise ValueError("an incomplete request")
            data += chunk
        if len(fds) != 2:
            raise ValueError("a request without its output")
        request = json.loads(data)
        if not isinstance(request.get("node"), str) or not isinstance(request.get("command"),
                                                                      str):
            raise ValueError("a malformed request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    conn.settimeout(None)
    return request, fds


def _launch(config: dict, node: str, command: str, out: list[int]) -> tuple[subprocess.Popen,
                                                                            int]:
    remote = shlex.join([*config["sandbox"], "@" + config["plans"][node], "--", "/bin/sh",
                         "-c", command])
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([*config["agent"], node, remote], stdin=read_end,
                                stdout=out[0], stderr=out[1], preexec_fn=_die_with_parent)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


def serve(config_path: str, argv: list[str]) -> int:
    done = []  # the controller's word that every rank runs: no start is made any more
    signal.signal(signal.SIGUSR1, lambda *_: done.append(1))
    with open(config_path) as f:
        config = json.load(f)
    waiting = list(config["nodes"])  # each node's start, once
    folder, address = _address(config["socket"])
    name = os.path.basename(config["socket"])
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(len(waiting) + 1)
    listener.setblocking(False)

    def close_listener() -> None:
        nonlocal listener
        if listener is not None:
            listener.close()
            listener = None
            try:
                os.unlink(name, dir_fd=folder)
            except OSError:
                pass

    if not waiting:
        close_listener()
    local = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    remotes: list[Remote] = []
    try:
        while local.poll() is None:
            if done:
                close_listener()
            watched = [r.conn for r in remotes if r.conn is not None]
            if listener is not None:
                watched.append(listener)
            ready, _, _ = select.select(watched, [], [], TICK_S)
            if listener is not None and listener in ready:
                try:
                    conn, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    conn = None
                if conn is not None:
                    _take(config, conn, waiting, remotes)
                    if not waiting:
                        close_listener()
            for r in remotes:
                if r.conn is None:
                    continue
                code = r.proc.poll()
                if code is not None:
                    r.close(_status(code))
                elif r.conn in ready:
                    try:
                        gone = not r.conn.recv(4096, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:  # the client was killed: that node's sandbox ends
                        r.close(None)
    finally:
        close_listener()
        os.close(folder)
        for r in remotes:
            r.close(None)
        deadline = time.monotonic() + STOP_S
        for r in remotes:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
    code = local.wait()
    stopped = [r.node for r in remotes if r.proc.returncode == LIMIT_EXIT]
    if code >= 0 and stopped:
        # a node's sandbox stopped its part of the job at one of its limits (its line is on
        # the job's output): the job ends as a job stopped at a limit does on one node,
        # whatever the launcher made of its lost daemon (PRRTE may even end with 0)
        code = LIMIT_EXIT
    if code < 0:  # the sandbox died of a signal: so does its broker (the controller reads it)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _take(config: dict, conn: socket.socket, waiting: list[str], remotes: list[Remote]) -> None:
    """A client's request: that node's sandbox started, or the request refused."""
    try:
        request, out = _request(conn)
    except (OSError, ValueError) as exc:
        conn.close()
        sys.stderr.write(f"[commbench remote start] a request was refused: {exc}\n")
        return
    node = request["node"]
    try:
        _answer(config, conn, node, request["command"], out, waiting, remotes)
    except OSError:  # the client went before its answer
        conn.close()
    finally:
        for fd in out:
            os.close(fd)


def _answer(config: dict, conn: socket.socket, node: str, command: str, out: list[int],
            waiting: list[str], remotes: list[Remote]) -> None:
    if node not in waiting:
        why = (f"{node} is not a node of this job that waits for its start" if node not in
               config["nodes"] else f"{node} was started already")
        conn.sendall(f"REFUSED {why}\n".encode())
        conn.close()
        return
    waiting.remove(node)
    try:
        proc, lifeline = _launch(config, node, command, out)
    except OSError as exc:
        conn.sendall(f"REFUSED the agent did not start: {exc}\n".encode())
        conn.close()
        return
    remotes.append(Remote(node, conn, proc, lifeline))


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        return start(argv[1:])
    if argv[:1] == ["serve"] and len(argv) > 3 and argv[2] == "--":
        return serve(argv[1], argv[3:])
    sys.stderr.write("usage: remote_start.py serve CONFIG -- ARGV... | start NODE COMMAND...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
