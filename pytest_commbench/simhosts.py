"""Simulated hosts: two Linux "hosts" on one machine, made without privilege, for jobs whose
ranks span nodes: the plugin's tests and CI, and anyone who wants to see a cross-node set-up
(a hostfile, a launcher's ssh agent, MPI over TCP) work on one machine before a cluster.

A rig is one user namespace of the caller's own (its user mapped to root inside, as
`unshare --user --map-root-user` makes it) and one PID namespace, whose first process (the
keeper) holds the hosts. Each host has its own

- network namespace: loopback, and one end (`eth0`) of a veth pair joining it to the other
  host, with an address of a private /30 (the first host .1, the second .2): the only
  addresses the rig ever uses, in namespaces it made;
- UTS namespace: its hostname (`h1`, `h2`);
- mount namespace: a /tmp and a /dev/shm of its own (fresh tmpfs) and an /etc/hosts that
  names every host; the rest of the machine's filesystem as it is.

The folders named `shared` (and the rig's own folder) are the same on every host, at the
same path: a cluster's shared filesystem, where a controller keeps its runs and its jobs'
folders. Every host's processes live in the rig's PID namespace: when the keeper ends (the
rig closed, or the process that made it gone), every process on every host ends with it, and
the namespaces, the veth pair and the rig's folder go too.

What a launcher needs (see `SimHosts`): `agent`, an executable that runs a command on a host
as ssh does (`agent HOST COMMAND...`, Open MPI 5: `--prtemca plm_ssh_agent AGENT`),
`hostfile`, `mpi_options()` (TCP on the pair's /30 only), and `launcher()`: an `mpirun` that
runs on the first host, as a job's launcher runs on a node of its allocation.

This file runs as a script too (`python simhosts.py keeper|host ...`: the keeper and each
host's first process, inside the namespaces); it imports nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOSTS = ("h1", "h2")
SUBNET = "10.77.0.0/30"  # the veth pair's: h1 10.77.0.1, h2 10.77.0.2 (inside the rig only)
IFNAME = "eth0"  # each host's end of the pair
SLOTS = 4  # ranks a host takes in the hostfile
START_S = 60.0  # the rig's set-up may take this long
STOP_S = 10.0  # ... and its teardown
DIR_PREFIX = "commbench-simhosts-"
SCRIPT = Path(__file__).resolve()
PR_SET_PDEATHSIG = 1


class Unavailable(RuntimeError):
    """Simulated hosts cannot be made on this machine (the message says why)."""


def _tools() -> dict[str, str | None]:
    return {name: shutil.which(name) for name in ("unshare", "nsenter", "ip", "mount")}


_PROBED: list[str | None] = []


def unavailable() -> str | None:
    """None where a rig can be made here, else why not (once per process): the tools
    (util-linux's unshare, nsenter and mount, iproute2's ip) and unprivileged user namespaces
    that may make network, mount, UTS and PID namespaces and a veth pair."""
    if _PROBED:
        return _PROBED[0]
    reason = None
    if sys.platform != "linux":
        reason = f"simulated hosts need Linux namespaces (this is {sys.platform})"
    else:
        missing = [name for name, path in _tools().items() if path is None]
        if missing:
            reason = (f"simulated hosts need {', '.join(missing)} (util-linux, iproute2), not "
                      "found on PATH")
    if reason is None:
        tools = _tools()
        probe = (f"{tools['ip']} link add a0 type veth peer name b0 && "
                 f"{tools['ip']} link set a0 up && {tools['mount']} -t tmpfs t /tmp")
        argv = [tools["unshare"], "--user", "--map-root-user", "--pid", "--fork", "--mount",
                "--net", "--uts", "/bin/sh", "-c", probe]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = f"the namespaces probe failed: {exc}"
        else:
            if done.returncode != 0:
                why = (done.stderr or done.stdout).strip().splitlines()
                reason = ("unprivileged user namespaces (with network, mount, UTS and PID "
                          "namespaces and a veth pair in them) are not available here: "
                          f"{why[-1] if why else f'exit code {done.returncode}'}")
    _PROBED.append(reason)
    return reason


def addresses(names: tuple[str, ...] = HOSTS, subnet: str = SUBNET) -> dict[str, str]:
    """Each host's address on the pair: the /30's first and second."""
    if len(names) != 2:
        raise ValueError(f"a rig has two hosts (one veth pair), not {len(names)}")
    base, bits = subnet.split("/")
    if bits != "30":
        raise ValueError(f"the pair's subnet is a /30, not /{bits}")
    a, b, c, d = (int(x) for x in base.split("."))
    if d % 4:
        raise ValueError(f"{subnet} is not a /30's first address")
    return {name: f"{a}.{b}.{c}.{d + 1 + i}" for i, name in enumerate(names)}


def _die_with_parent(parent: int) -> None:  # pragma: no cover - in the child
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _readline(stream, deadline: float, what: str) -> str:
    """One line from a child's pipe before `deadline` (time.monotonic), else an error."""
    fd = stream.fileno()
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(f"{what} did not answer within the time allowed")
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise Unavailable(f"{what} ended before it was ready")
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


def sweep(folder: str | os.PathLike | None = None) -> None:
    """Remove the folders of rigs whose makers are gone (one killed outright leaves its
    folder: its namespaces and processes went with it)."""
    root = Path(folder or tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        found = re.fullmatch(re.escape(DIR_PREFIX) + r"(\d+)-[0-9a-f]+", entry.name)
        if not found or not entry.is_dir() or entry.is_symlink():
            continue
        try:
            os.kill(int(found.group(1)), 0)
            continue  # its maker lives
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)


AGENT = r"""#!/bin/sh
# The simulated hosts' ssh: AGENT [OPTIONS] HOST COMMAND... runs COMMAND on HOST, its words
# joined as ssh joins them, with /bin/sh, in the calling folder (/ where HOST has none).
# With --exec: AGENT --exec HOST PROGRAM ARGS... runs PROGRAM with exactly those arguments.
exact=
while [ $# -gt 0 ]; do
  case "$1" in --exec) exact=1; shift ;; -*) shift ;; *) break ;; esac
done
if [ $# -lt 2 ]; then echo "usage: $0 [--exec] HOST COMMAND..." >&2; exit 255; fi
host=$1; shift
case "$host" in
@CASES@
*) echo "simulated hosts: there is no host '$host' (@NAMES@)" >&2; exit 255 ;;
esac
if [ "$(readlink /proc/self/ns/user)" = "@USERNS@" ]; then
  # on a host of the rig already: only the other host's network, mounts and name
  set -- --net=/proc/$inner/ns/net --mount=/proc/$inner/ns/mnt --uts=/proc/$inner/ns/uts \
    -- /bin/sh -c 'cd "$0" 2>/dev/null || cd /; if [ -n "$1" ]; then shift; exec "$@"; fi; shift; eval "$*"' \
    "$PWD" "$exact" "$@"
else
  set -- --target=$outer --user --preserve-credentials --pid --net --mount --uts \
    -- /bin/sh -c 'cd "$0" 2>/dev/null || cd /; if [ -n "$1" ]; then shift; exec "$@"; fi; shift; eval "$*"' \
    "$PWD" "$exact" "$@"
fi
exec @NSENTER@ "$@"
"""

ON_HOST = """#!/bin/sh
# @WHAT@ on host @HOST@ of the simulated hosts
exec @AGENT@ --exec @HOST@ @PROGRAM@ "$@"
"""


def own_software() -> list[str]:
    """What the hosts must run that lies in a tree each host replaces (/tmp, /dev/shm): this
    Python's environment, the package's checkout and the MPI's prefix (a clone under /tmp
    would vanish from the hosts with the controller's /tmp); shared at the same path, as a
    cluster's software tree is."""
    from .launch import find_mpiexec  # (the controller's side: this file runs as a script too)

    found = [sys.prefix, sys.base_prefix, str(SCRIPT.parent.parent)]
    mpiexec = find_mpiexec()
    if mpiexec:
        found.append(str(Path(os.path.realpath(mpiexec)).parent.parent))
    private = ("/tmp", "/dev/shm")
    return sorted({str(Path(x).resolve()) for x in found
                   if any(str(Path(x).resolve()).startswith(t + "/") for t in private)})


def default_mpiexec() -> str | None:
    """The MPI launcher of this Python's environment, else the PATH's."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def open_mpi_major(program: str) -> int | None:
    """Open MPI's major version of the launcher `program` (None: not Open MPI, or unknown)."""
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+)\.", done.stdout + done.stderr)
    return int(found.group(1)) if found else None


class SimHosts:
    """A rig of simulated hosts (see the module's docstring): `start()` (or `with`) makes it,
    `close()` removes everything it made, on any failure too.

    `shared`: folders each host sees at the same path (besides the rig's own folder);
    `slots`: ranks per host in the hostfile; `folder`: where the rig's folder is made."""

    def __init__(self, shared: tuple[str | os.PathLike, ...] = (), names: tuple[str, ...] = HOSTS,
                 subnet: str = SUBNET, slots: int = SLOTS,
                 folder: str | os.PathLike | None = None) -> None:
        self.names = tuple(names)
        self.address = addresses(self.names, subnet)
        self.subnet = subnet
        self.slots = slots
        self.shared = [str(Path(p).resolve()) for p in shared] + own_software()
        self.folder = folder
        self.dir: Path | None = None
        self.keeper: subprocess.Popen | None = None
        self.inner: dict[str, int] = {}  # each host's first process, as the rig sees it
        self.outer: dict[str, int] = {}  # ... and as this process sees it
        self.userns = ""  # the rig's user namespace (readlink of /proc/PID/ns/user)
        self.netns: dict[str, str] = {}  # each host's network namespace (likewise)
        self.pidns = ""
        self.keeper_pid = -1  # the keeper, as this process sees it

    # -- the rig's files -----------------------------------------------------------------
    @property
    def agent(self) -> Path:
        return self._path("agent")

    @property
    def hostfile(self) -> Path:
        return self._path("hostfile")

    def _path(self, name: str) -> Path:
        if self.dir is None:
            raise RuntimeError("the rig is not started")
        return self.dir / name

    def launcher(self, program: str | None = None, name: str = "mpirun") -> Path:
        """An executable `name` in the rig's folder that runs `program` (default: the MPI
        launcher of this Python's environment) on the first host with the arguments it is
        given: the launcher of a job whose ranks span the hosts."""
        if program is None:
            program = default_mpiexec()
        if program is None:
            raise Unavailable("no MPI launcher (mpiexec) found")
        path = self._path("bin") / name
        path.parent.mkdir(exist_ok=True)
        text = (ON_HOST.replace("@WHAT@", name).replace("@HOST@", self.names[0])
                .replace("@AGENT@", _quote(str(self.agent))).replace("@PROGRAM@", _quote(program)))
        path.write_text(text)
        path.chmod(0o755)
        return path

    def mpi_options(self, program: str | None = None) -> list[str]:
        """Open MPI's options for a job over the rig (`program`: the launcher they are for,
        default as `launcher`'s): its ssh agent, TCP on the pair's /30 for the launcher's
        daemons and for the ranks (and no other transport between hosts), no binding (the
        hosts share this machine's CPUs). Open MPI 5's launcher (PRRTE) takes its agent as
        `--prtemca plm_ssh_agent` (it ignores `plm_rsh_agent`); Open MPI 4's (ORTE) as
        `--mca plm_rsh_agent`."""
        program = program or default_mpiexec()
        # (the remote launcher named too: an environment may have chosen another, e.g.
        # OMPI_MCA_plm=isolated, which starts every rank on the launcher's own host)
        if program and open_mpi_major(program) == 4:
            launch = ["--mca", "plm", "rsh", "--mca", "plm_rsh_agent", str(self.agent)]
        else:
            launch = ["--prtemca", "plm", "ssh", "--prtemca", "plm_ssh_agent", str(self.agent),
                      "--prtemca", "oob_tcp_if_include", self.subnet]
        return [*launch,
                "--mca", "oob_tcp_if_include", self.subnet,
                "--mca", "btl", "self,tcp,vader",
                "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "pml", "ob1",
                "--bind-to", "none"]

    def controller_env(self) -> dict[str, str]:
        """What a controller outside the rig needs to be reached by node agents on its
        hosts (`cluster.listen`): its listening socket made on the first host (in its
        network, by `python simhosts.py listen` through the rig's agent, and handed back over
        a Unix socket), the agents told that host's address."""
        listen = [str(self.agent), "--exec", self.names[0], sys.executable, "-I", str(SCRIPT),
                  "listen"]
        return {"COMMBENCH_AGENT_LISTEN": " ".join(_quote(w) for w in listen),
                "COMMBENCH_AGENT_ADDRESS": self.address[self.names[0]]}

    def command(self, host: str, argv: list[str]) -> list[str]:
        """The command that runs `argv` on `host` (in the calling folder, where the host
        has it)."""
        if host not in self.inner:
            raise ValueError(f"no host {host!r} ({', '.join(self.names)})")
        return [str(self.agent), "--exec", host, *argv]

    def run(self, host: str, argv: list[str], timeout: float = 60.0,
            **kwargs) -> subprocess.CompletedProcess:
        """Run `argv` on `host` to its end (at most `timeout` seconds)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(host, argv), timeout=timeout, **kwargs)

    # -- what runs where -----------------------------------------------------------------
    def processes(self, host: str | None = None) -> list[int]:
        """This process's pids of the rig's live processes (on `host`: those in its network
        namespace), the keeper and the hosts' first processes left out."""
        if not self.pidns:
            return []
        held = {*self.outer.values(), self.keeper_pid}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in held:
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != self.pidns:
                    continue
                if host is not None and os.readlink(f"/proc/{entry}/ns/net") != self.netns[host]:
                    continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:
                continue
            if stat[stat.rfind(")") + 2:].split()[0] != "Z":
                found.append(int(entry))
        return found

    # -- start and stop --------------------------------------------------------------------
    def start(self) -> SimHosts:
        reason = unavailable()
        if reason:
            raise Unavailable(reason)
        sweep(self.folder)
        root = Path(self.folder or tempfile.gettempdir())
        path = root / f"{DIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir(mode=0o755)
        self.dir = path.resolve()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        assert self.dir is not None
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{addr} {name}" for name, addr in self.address.items()]
        (self.dir / "hosts").write_text("\n".join(lines) + "\n")
        config = {"names": list(self.names), "address": self.address,
                  "prefix": int(self.subnet.split("/")[1]), "ifname": IFNAME,
                  "shared": [str(self.dir), *self.shared], "tools": _tools(),
                  "hosts_file": str(self.dir / "hosts"), "python": sys.executable,
                  "script": str(SCRIPT)}
        (self.dir / "rig.json").write_text(json.dumps(config))
        tools = _tools()
        argv = [tools["unshare"], "--user", "--map-root-user", "--pid", "--fork",
                "--kill-child", "--mount-proc", sys.executable, "-I", str(SCRIPT), "keeper",
                str(self.dir / "rig.json")]
        parent = os.getpid()
        log = open(self.dir / "keeper.log", "wb")  # noqa: SIM115 - the keeper's stderr
        try:
            self.keeper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=log, start_new_session=True,
                                           preexec_fn=lambda: _die_with_parent(parent))
        finally:
            log.close()
        try:
            line = _readline(self.keeper.stdout, time.monotonic() + START_S, "the rig's keeper")
            state = json.loads(line)
        except (Unavailable, ValueError) as exc:
            raise Unavailable(f"the simulated hosts did not start: {exc}; "
                              f"{self._keeper_log()}") from None
        if "error" in state:
            raise Unavailable(f"the simulated hosts did not start: {state['error']}")
        self.inner = {name: int(pid) for name, pid in state["pids"].items()}
        keeper = _only_child(self.keeper.pid)
        if keeper is None:
            raise Unavailable("the rig's keeper could not be found")
        self.keeper_pid = keeper
        self.pidns = os.readlink(f"/proc/{keeper}/ns/pid")
        self.userns = os.readlink(f"/proc/{keeper}/ns/user")
        self.outer = {name: _outer_pid(self.pidns, pid) for name, pid in self.inner.items()}
        if any(pid is None for pid in self.outer.values()):
            raise Unavailable("the hosts' first processes could not be found")
        self.netns = {name: os.readlink(f"/proc/{pid}/ns/net") for name, pid in self.outer.items()}
        cases = "\n".join(f"{name}|{self.address[name]}) inner={self.inner[name]} "
                          f"outer={self.outer[name]} ;;" for name in self.names)
        agent = (AGENT.replace("@CASES@", cases).replace("@NAMES@", ", ".join(self.names))
                 .replace("@USERNS@", self.userns).replace("@NSENTER@", tools["nsenter"]))
        self.agent.write_text(agent)
        self.agent.chmod(0o755)
        self.hostfile.write_text("".join(f"{name} slots={self.slots}\n" for name in self.names))

    def _keeper_log(self) -> str:
        try:
            text = (self.dir / "keeper.log").read_text(errors="replace").strip()
        except (OSError, TypeError):
            text = ""
        return f"the keeper said: {text[-2000:]}" if text else "the keeper said nothing"

    def close(self) -> None:
        """End every process of the rig and remove its namespaces and folder (bounded)."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            try:
                keeper.stdin.close()  # the keeper's signal to end the hosts and itself
            except OSError:
                pass
            try:
                keeper.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                _kill_session(keeper.pid)
                keeper.wait(timeout=STOP_S)
            if keeper.stdout is not None:
                keeper.stdout.close()
            _kill_session(keeper.pid)  # whatever of its session outlived it (nsenter)
        # the kernel ends the rig's processes with its PID 1; those of a job's own sandbox
        # (a PID namespace inside, the host's network) go a moment later
        closed = time.clock_gettime(time.CLOCK_BOOTTIME)
        deadline = time.monotonic() + STOP_S
        while self.pidns and time.monotonic() < deadline and left_behind(
                self.pidns, list(self.netns.values()), closed):
            time.sleep(0.05)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> SimHosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _only_child(pid: int) -> int | None:
    from .launch import children  # (the controller's side: this file runs as a script too)

    kids = children(pid)
    return kids[0] if len(kids) == 1 else None


def _outer_pid(pidns: str, inner: int) -> int | None:
    """The pid (in this process's namespace) of the process that is `inner` in `pidns`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != pidns:
                continue
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == inner:
                            return int(entry)
                        break
        except (OSError, ValueError):
            continue
    return None


def left_behind(pidns: str, netns: list[str], before: float | None = None) -> list[str]:
    """What is left of a closed rig: every process in its PID namespace or in one of its
    hosts' network namespaces, as "PID (command)" (a network namespace, and the veth in it,
    lives while a process is in it). `before` (CLOCK_BOOTTIME seconds, the rig's close): a
    process started later is not the rig's, whatever namespace it is in (the kernel gives a
    freed namespace's number to a new one: another rig's, made meanwhile)."""
    found = []
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if (os.readlink(f"/proc/{entry}/ns/pid") != pidns
                    and os.readlink(f"/proc/{entry}/ns/net") not in netns):
                continue
            if before is not None:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    started = int(f.read().rsplit(b")", 1)[1].split()[19]) / tick
                if started > before:
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        found.append(f"{entry} ({command[:120]})")
    return found


def _kill_session(sid: int) -> None:
    from .launch import session_pids  # (the controller's side)

    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# -- inside the rig: the keeper and each host's first process ------------------------------

def _keeper(config_path: str) -> int:  # pragma: no cover - runs inside the namespaces
    """PID 1 of the rig: makes the hosts and the pair, says where they are (one JSON line),
    reaps orphans, and ends the hosts when its standard input closes (or on SIGTERM)."""
    config = json.loads(Path(config_path).read_text())
    tools = config["tools"]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    hosts: dict[str, subprocess.Popen] = {}
    try:
        for name in config["names"]:
            hosts[name] = subprocess.Popen(
                [tools["unshare"], "--net", "--mount", "--uts", config["python"], "-I",
                 config["script"], "host", config_path, name],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        deadline = time.monotonic() + START_S
        for name, proc in hosts.items():
            line = _readline(proc.stdout, deadline, f"host {name}")
            if line != "ready":
                raise RuntimeError(f"host {name}: {line}")
        pids = {name: proc.pid for name, proc in hosts.items()}
        first, second = config["names"]
        ip, ifname, prefix = tools["ip"], config["ifname"], config["prefix"]

        def on(name: str, *argv: str) -> None:
            done = subprocess.run([tools["nsenter"], f"--net=/proc/{pids[name]}/ns/net", ip,
                                   *argv], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise RuntimeError(f"ip {' '.join(argv)} on {name}: {done.stderr.strip()}")

        on(first, "link", "add", ifname, "type", "veth", "peer", "name", ifname, "netns",
           str(pids[second]))
        for name in config["names"]:
            # no address but its own: no IPv6 link-local one either
            on(name, "link", "set", ifname, "addrgenmode", "none")
            on(name, "addr", "add", f"{config['address'][name]}/{prefix}", "dev", ifname)
            on(name, "link", "set", ifname, "up")
        print(json.dumps({"pids": pids}), flush=True)
    except Exception as exc:  # noqa: BLE001 - said to the maker, which stops
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        for proc in hosts.values():
            proc.kill()
        return 1
    # until told to stop: reap the orphans every host's processes leave to PID 1
    while not stop:
        try:
            ready, _, _ = select.select([0], [], [], 0.5)
        except InterruptedError:
            ready = []
        if ready and not os.read(0, 4096):
            break
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
    for proc in hosts.values():
        proc.kill()
    return 0  # PID 1 ends: the kernel ends every process of the rig


def _host(config_path: str, name: str) -> int:  # pragma: no cover - inside the namespaces
    """A host's first process, in its new network, mount and UTS namespaces: its name, its
    own /tmp and /dev/shm, the shared folders bound back at their paths, its /etc/hosts and
    loopback; then it holds the namespaces until its standard input closes."""
    config = json.loads(Path(config_path).read_text())
    mount, ip = config["tools"]["mount"], config["tools"]["ip"]

    def run(*argv: str, keep: tuple[int, ...] = ()) -> None:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                              pass_fds=keep)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")

    try:
        socket.sethostname(name)
        # the shared folders, held before /tmp is replaced (one may lie inside it)
        shared = sorted(dict.fromkeys(config["shared"]), key=len)
        held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in shared]
        run(mount, "--make-rprivate", "/")
        for tree in ("/tmp", "/dev/shm"):
            run(mount, "-t", "tmpfs", "-o", "mode=1777", f"simhost-{name}", tree)
        for path, fd in held:
            os.makedirs(path, exist_ok=True)
            run(mount, "--no-canonicalize", "--rbind", f"/proc/self/fd/{fd}", path, keep=(fd,))
            os.close(fd)
        if os.path.exists("/etc/hosts"):
            run(mount, "--bind", config["hosts_file"], "/etc/hosts")
        run(ip, "link", "set", "lo", "up")
    except Exception as exc:  # noqa: BLE001 - said to the keeper
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    while os.read(0, 4096):
        pass
    return 0


USAGE = """usage: python -m pytest_commbench.simhosts run [--shared DIR]... -- COMMAND...

Runs COMMAND on the first of two simulated hosts (h1, h2), the current folder and each DIR
shared between them, and removes them afterwards. COMMAND gets the variables a benchmark run
reads: COMMBENCH_LAUNCHER (mpirun with the rig's ssh agent and TCP on its pair),
COMMBENCH_HOSTFILE, and SIMHOSTS_AGENT. For example:

    python -m pytest_commbench.simhosts run -- pytest suites --platform=cpu -m span_nodes \\
        --commbench-ranks-per-node=2
"""


def main(argv: list[str]) -> int:
    """`run`: a command with simulated hosts up (see USAGE)."""
    if argv[:1] != ["run"] or "--" not in argv:
        sys.stderr.write(USAGE)
        return 2
    at = argv.index("--")
    options, command = argv[1:at], argv[at + 1:]
    shared = [os.getcwd()]
    while options:
        if options[0] == "--shared" and len(options) > 1:
            shared.append(options[1])
            options = options[2:]
        else:
            sys.stderr.write(f"unknown option {options[0]!r}\n{USAGE}")
            return 2
    if not command:
        sys.stderr.write(USAGE)
        return 2
    try:
        with SimHosts(shared=tuple(shared)) as rig:
            program = default_mpiexec()
            if program is None:
                raise Unavailable("no MPI launcher (mpiexec) found")
            env = dict(os.environ,
                       COMMBENCH_LAUNCHER=" ".join(_quote(w) for w in
                                                   [program, *rig.mpi_options(program)]),
                       COMMBENCH_HOSTFILE=str(rig.hostfile), SIMHOSTS_AGENT=str(rig.agent))
            env.pop("COMMBENCH_UNSANDBOXED", None)
            # on the first host, as a controller runs on a node of its allocation
            return subprocess.run(rig.command(rig.names[0], command), env=env).returncode
    except Unavailable as exc:
        sys.stderr.write(f"simulated hosts: {exc}\n")
        return 3


def _listen(path: str, address: str) -> int:  # pragma: no cover - runs on a host of the rig
    """A listening TCP socket on an ephemeral port of `address` (this host's network), sent
    over the Unix socket at `path` to the controller that asked for it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((address, 0))
    server.listen(16)
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix.connect(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
        socket.send_fds(unix, [b"listening"], [server.fileno()])
    finally:
        os.close(folder)
        unix.close()
    return 0


if __name__ == "__main__":  # pragma: no cover - the rig's own processes, and `run`
    if sys.argv[1:2] == ["listen"]:
        sys.exit(_listen(sys.argv[2], sys.argv[3]))
    if sys.argv[1:2] == ["keeper"]:
        sys.exit(_keeper(sys.argv[2]))
    if sys.argv[1:2] == ["host"]:
        sys.exit(_host(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1:]))
