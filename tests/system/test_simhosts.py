"""Simulated hosts (`pytest_commbench.simhosts`): two hosts on this machine, made without
privilege, joined by a veth pair on a private /30. An MPI job across them (each rank on its
own host, with its own name, address, /tmp and /dev/shm), a rank killed on the second host,
the rig removed with nothing left (by its maker, and when its maker is killed), and
benchmark items whose ranks span the hosts through the placement options (the job's folder on
the hosts' shared filesystem), in a sandbox per host with the controller on h1: what a rank
on either host can see, a rank killed, a hang, the controller killed, nothing left on either
host after any of them (Open MPI 5, and 4 where the system has it). Every job here is
bounded in time."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_commbench import sandbox, simhosts

JOB_S = 60  # an MPI job on the rig takes about a second

HELLO = r"""
import fcntl, json, os, socket, struct, sys
from mpi4py import MPI

def address(ifname="eth0"):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
for tree in ("/tmp", "/dev/shm"):
    open(f"{tree}/commbench-mark-{rank}", "w").write("x")
comm.Barrier()
seen = {tree: sorted(n for n in os.listdir(tree) if n.startswith("commbench-mark-"))
        for tree in ("/tmp", "/dev/shm")}
total = comm.allreduce(rank + 1)
said = comm.gather({"rank": rank, "host": socket.gethostname(), "address": address(),
                    "seen": seen, "sum": total}, root=0)
if rank == 0:
    print("HELLO " + json.dumps(said), flush=True)
"""

DIE = r"""
import os, signal, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.Get_rank() == 1:
    print(f"rank 1 on {socket.gethostname()} kills itself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
comm.Barrier()  # rank 0 waits for a peer that is gone
time.sleep(600)
"""


def _mpi_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    # the ranks are root inside the rig's user namespace (this user outside)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1")
    return env


def _mpirun(rig: simhosts.SimHosts, script: Path, world: int = 2) -> list[str]:
    per = ",".join(f"{name}:1" for name in rig.names)
    return [str(rig.launcher()), *rig.mpi_options(), "-n", str(world), "--host", per,
            "--map-by", "slot", sys.executable, str(script)]


def _quiet(rig: simhosts.SimHosts, limit: float = 10.0) -> list[int]:
    """The rig's processes still there `limit` seconds from now at most (none: at once)."""
    deadline = time.monotonic() + limit
    while rig.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return rig.processes()


def test_an_mpi_job_has_a_rank_on_each_host_with_its_own_name_address_and_tmp(sim_hosts,
                                                                            tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    done = subprocess.run(_mpirun(sim_hosts, script), capture_output=True, text=True,
                          timeout=JOB_S, env=_mpi_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("HELLO "))
    said = json.loads(line[len("HELLO "):])
    assert [(r["host"], r["address"]) for r in said] == [("h1", "10.77.0.1"),
                                                          ("h2", "10.77.0.2")]
    for r in said:  # each host's /tmp and /dev/shm are its own: a rank sees its mark alone
        assert r["seen"] == {"/tmp": [f"commbench-mark-{r['rank']}"],
                             "/dev/shm": [f"commbench-mark-{r['rank']}"]}
        assert r["sum"] == 3
    assert _quiet(sim_hosts) == []
    # this machine's /tmp has neither mark: the hosts' trees are not the controller's
    assert not list(Path("/tmp").glob("commbench-mark-*"))


def test_a_command_runs_on_the_host_named_and_a_host_reaches_the_other(sim_hosts, tmp_path):
    done = sim_hosts.run("h2", ["sh", "-c", "hostname; pwd"], cwd=tmp_path, timeout=JOB_S)
    assert done.returncode == 0 and done.stdout.split() == ["h2", str(tmp_path)]
    # the agent from the first host (as the launcher there calls it): ssh's joined words
    done = sim_hosts.run("h1", [str(sim_hosts.agent), "h2", "echo", "$(hostname)"],
                         timeout=JOB_S)
    assert done.returncode == 0 and done.stdout.strip() == "h2", done.stderr
    bad = sim_hosts.run("h1", [str(sim_hosts.agent), "h3", "true"], timeout=JOB_S)
    assert bad.returncode == 255 and "no host 'h3'" in bad.stderr
    assert sim_hosts.hostfile.read_text() == f"h1 slots={simhosts.SLOTS}\nh2 slots={simhosts.SLOTS}\n"


def test_a_command_runs_with_the_hosts_up_and_the_variables_a_run_reads(tmp_path):
    reason = simhosts.unavailable()
    if reason:
        pytest.skip(reason)
    show = ('echo "$COMMBENCH_HOSTFILE|${COMMBENCH_UNSANDBOXED-unset}|$(hostname)|$PWD"; '
            '"$SIMHOSTS_AGENT" h2 hostname; '
            'case "$COMMBENCH_LAUNCHER" in */bin/mpi*plm_ssh_agent*|*/bin/mpi*plm_rsh_agent*) '
            'echo ok ;; esac')
    done = subprocess.run([sys.executable, "-m", "pytest_commbench.simhosts", "run", "--",
                           "sh", "-c", show], capture_output=True, text=True, timeout=JOB_S,
                          cwd=tmp_path, env={**os.environ, "COMMBENCH_UNSANDBOXED": "1",
                                             "PYTHONPATH": str(
                              Path(simhosts.__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    hostfile, unsandboxed, host, where = done.stdout.splitlines()[0].split("|")
    # on the first host, in the calling folder; jobs run in their sandboxes
    assert hostfile.endswith("/hostfile") and unsandboxed == "unset"
    assert (host, where) == ("h1", str(tmp_path))
    assert done.stdout.splitlines()[1:] == ["h2", "ok"]
    assert not Path(hostfile).exists()  # the rig is gone with the command
    usage = subprocess.run([sys.executable, "-m", "pytest_commbench.simhosts", "run"],
                           capture_output=True, text=True, timeout=JOB_S, env={
                               **os.environ, "PYTHONPATH": str(Path(simhosts.__file__).parent.parent)})
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_a_rank_killed_on_the_second_host_ends_the_job_and_leaves_nothing(sim_hosts, tmp_path):
    script = tmp_path / "die.py"
    script.write_text(DIE)
    began = time.monotonic()
    done = subprocess.run(_mpirun(sim_hosts, script), capture_output=True, text=True,
                          timeout=JOB_S, env=_mpi_env(), cwd=tmp_path)
    took = time.monotonic() - began
    out = done.stdout + done.stderr
    assert done.returncode != 0 and took < 30, out
    assert "rank 1 on h2 kills itself" in out
    assert _quiet(sim_hosts) == [], "processes left on the hosts"
    for host in sim_hosts.names:
        assert sim_hosts.processes(host) == []


def test_closing_the_rig_ends_what_runs_on_it_and_removes_everything(tmp_path):
    reason = simhosts.unavailable()
    if reason:
        pytest.skip(reason)
    rig = simhosts.SimHosts(shared=(tmp_path,)).start()
    try:
        sleeper = subprocess.Popen(rig.command("h2", ["sleep", "600"]), start_new_session=True)
        deadline = time.monotonic() + 10
        while not rig.processes("h2") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rig.processes("h2"), "the command never ran on h2"
        pidns, netns, folder = rig.pidns, list(rig.netns.values()), rig.dir
    finally:
        rig.close()
    closed = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert sleeper.wait(timeout=10) != 0  # ended with the rig
    assert simhosts.left_behind(pidns, netns, closed) == []
    assert not folder.exists() and rig.dir is None
    rig.close()  # twice is harmless


def test_a_rig_whose_maker_is_killed_goes_with_it(tmp_path):
    reason = simhosts.unavailable()
    if reason:
        pytest.skip(reason)
    maker = (f"import json, sys, time; sys.path.insert(0, {str(Path(simhosts.__file__).parent.parent)!r})\n"
             "from pytest_commbench import simhosts\n"
             f"rig = simhosts.SimHosts(folder={str(tmp_path)!r}).start()\n"
             "print(json.dumps([rig.pidns, list(rig.netns.values()), str(rig.dir)]), flush=True)\n"
             "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", maker], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pidns, netns, folder = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        killed = time.clock_gettime(time.CLOCK_BOOTTIME)
        proc.wait(timeout=10)
        proc.stdout.close()
    deadline = time.monotonic() + 15
    while simhosts.left_behind(pidns, netns, killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert simhosts.left_behind(pidns, netns, killed) == []
    assert Path(folder).exists()  # its folder, until the next rig sweeps it
    simhosts.sweep(tmp_path)
    assert not Path(folder).exists()


# -- benchmark items whose ranks span the hosts ----------------------------------------------

def _span(bench, rig: simhosts.SimHosts, *args: str, hostfile: Path | None = None):
    launcher = shlex.join([str(rig.launcher()), *rig.mpi_options()])
    # the controller's port for the node agents, made on h1 (the controller is outside
    # the rig's network, as a login node may be outside a cluster's)
    for name, value in rig.controller_env().items():
        bench.pytester._monkeypatch.setenv(name, value)
    return bench.pytester.runpytest_subprocess(
        "suites", "-p", "no:cacheprovider", "--platform=cpu", "--commbench-unsandboxed",
        f"--commbench-launcher={launcher}", f"--commbench-hostfile={hostfile or rig.hostfile}",
        "--commbench-ranks-per-node=1", *args, timeout=240)


def _span_sandboxed(bench, rig: simhosts.SimHosts, *args: str, per_node: int = 1):
    """A run whose controller is on h1 (as on a node of its allocation), its jobs in their
    sandboxes, one on each host they span."""
    program = simhosts.default_mpiexec()
    launcher = shlex.join([program, *rig.mpi_options(program)])
    return bench.pytester.run(*rig.command("h1", [
        sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "--platform=cpu",
        f"--commbench-launcher={launcher}", f"--commbench-ranks-per-node={per_node}",
        *([] if any(a.startswith("--commbench-hostfile") for a in args) else
          [f"--commbench-hostfile={rig.hostfile}"]), *args]), timeout=240)


def test_an_item_with_a_rank_on_each_host_passes_and_its_record_names_them(bench, sim_hosts):
    bench.add_task("p2p/pingpong", ranks=2)
    result = _span_sandboxed(bench, sim_hosts)
    assert result.ret == 0, result.stdout.str()[-3000:]
    (record,) = bench.records()
    assert record["verdict"] == "pass", record["message"]
    assert record["hosts"] == ["h1", "h2"]
    # through a node agent on each host, each one's clock measured (one kernel: the same)
    assert set(record["clock_skew_us"]) == {"h1", "h2"}, record
    assert all(0 <= v < 1e6 for v in record["clock_skew_us"].values())
    assert _quiet(sim_hosts) == []
    # its mutants are rejected across the hosts as on one
    result = _span_sandboxed(bench, sim_hosts, "--commbench-model=mutants")
    mutants = [r for r in bench.records() if r["model"] == "mutants"]
    assert len(mutants) >= 2 and all(r["verdict"] == "wrong_answer" for r in mutants), [
        (r["candidate"], r["verdict"], r["message"]) for r in mutants]
    assert all(r["hosts"] == ["h1", "h2"] for r in mutants)
    assert _quiet(sim_hosts) == []


@pytest.mark.parametrize("sandboxed", [False, True], ids=["unsandboxed", "sandboxed"])
def test_ranks_that_land_elsewhere_than_asked_are_an_infra_error_saying_where(bench,
                                                                              sim_hosts,
                                                                              sandboxed):
    bench.add_task("p2p/pingpong", ranks=2)
    # the first host by its name and by its address: two nodes to the placement, one to MPI
    mixed = sim_hosts.dir / "mixed-hostfile"
    mixed.write_text(f"h1\n{sim_hosts.address['h1']}\n")
    if sandboxed:  # the controller on h1: the broker waits for a node mpirun never starts
        _span_sandboxed(bench, sim_hosts, f"--commbench-hostfile={mixed}")
    else:  # the controller off the hosts, its launcher on h1
        _span(bench, sim_hosts, hostfile=mixed)
    (record,) = bench.records()
    assert record["verdict"] == "infra_error"
    assert record["message"] == (
        "the ranks did not land where the launcher was asked to put them: they ran on "
        "h1: ranks 0-1 (asked: h1: rank 0; 10.77.0.1: rank 1)")
    assert record["hosts"] == ["h1", "h1"]
    assert _quiet(sim_hosts) == []


def test_software_in_a_tree_the_hosts_replace_is_shared_with_them(monkeypatch, tmp_path):
    """A checkout and its environment under /tmp (a fresh clone there) would vanish from the
    hosts with the controller's /tmp: they are bound back at their paths; trees the hosts keep
    (/usr, a home) need no binding."""
    from pytest_commbench import simhosts

    venv = Path("/tmp") / tmp_path.name / "venv"
    monkeypatch.setattr(simhosts.sys, "prefix", str(venv))
    monkeypatch.setattr(simhosts.sys, "base_prefix", "/usr")
    found = simhosts.own_software()
    assert str(venv) in found and "/usr" not in found
    assert all(x.startswith(("/tmp/", "/dev/shm/")) for x in found)


# -- a sandbox on each node: mpirun's here, its daemon's on the other host ---------------------

RANK = r"""
import json, os, signal, socket, sys, time
from pathlib import Path
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
job = Path(sys.argv[0]).resolve().parent.parent
open(f"/tmp/commbench-mark-{rank}", "w").write("x")
(job / f"up-{rank}").write_text(socket.gethostname())
comm.Barrier()
mode = os.environ.get("RANK_MODE", "hello")
if mode == "sleep":
    time.sleep(600)
if mode == "fork":  # ranks 0 (h1) and 2 (h2) start 400 children each, and hold them
    children, error = [], None
    if rank in (0, 2):
        for _ in range(400):
            try:
                pid = os.fork()
            except OSError as exc:
                error = exc.errno
                break
            if pid == 0:
                signal.pause()
                os._exit(0)
            children.append(pid)
        print(f"FORKED {rank} {len(children)} {error}", flush=True)
    comm.Barrier()  # both hold theirs at once
    time.sleep(1)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    sys.exit(0)
if mode == "die" and rank == 2:
    print(f"rank 2 on {socket.gethostname()} kills itself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "die":
    comm.Barrier()  # the others wait for a peer that is gone
    time.sleep(600)
said = comm.gather({
    "rank": rank, "host": socket.gethostname(),
    "pidns": os.readlink("/proc/self/ns/pid"), "userns": os.readlink("/proc/self/ns/user"),
    "seen": [p for p in sys.argv[1:] if os.path.exists(p)],
    "marks": sorted(n for n in os.listdir("/tmp") if n.startswith("commbench-mark-")),
}, root=0)
if rank == 0:
    print("HELLO " + json.dumps(said), flush=True)
"""

# the controller, on h1: a job of four ranks, two on each host, in a sandbox per host
DRIVE = r"""
import json, os, signal, shutil, sys, time
from pathlib import Path
from pytest_commbench import launch, sandbox
mpirun, python, job, script, mode, *hide = sys.argv[1:]
job = Path(job)
(job / "ro").mkdir(parents=True)
shutil.copyfile(script, job / "ro" / "rank.py")
mine = Path("/tmp/commbench-controller-file")  # the controller's own file, on its node
mine.write_text("x")
seen = [*hide, str(mine), os.environ["SIMHOSTS_AGENT"], str(job / "remote-start.sock")]
argv = [mpirun, *json.loads(os.environ["RIG_OPTIONS"]), "-n", "4", "--host", "h1:2,h2:2",
        "--map-by", "slot", python, str(job / "ro" / "rank.py"), *seen]
env = launch.mpi_env()
env.pop("OMPI_MCA_btl", None)
env["RANK_MODE"] = mode
limits = json.loads(os.environ.get("LIMITS", "null"))
command = sandbox.wrap_over_nodes(job, argv, env, hide=[Path(h) for h in hide], remote=["h2"],
                                  limits=limits)
running = launch.Job(command, job, 90, env=env)
if mode == "sleep":  # the controller dies once every rank is up
    deadline = time.monotonic() + 60
    while len(list(job.glob("up-*"))) < 4 and running.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    print("UP " + json.dumps(sorted(p.read_text() for p in job.glob("up-*"))), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
running.wait()
result = running.finish()
print("PIDNS " + os.readlink("/proc/self/ns/pid"))
print(f"RC {result.returncode}")
print(result.output)
"""


def _mpi(which: str) -> tuple[str, str]:
    """(mpirun, the Python whose mpi4py goes with it) of Open MPI `which` major, or a skip."""
    if which == "5":
        program, python = simhosts.default_mpiexec(), sys.executable
    else:
        program, python = "/usr/bin/mpirun", "/usr/bin/python3"
    if not program or not os.path.exists(program) or \
            simhosts.open_mpi_major(program) != int(which):
        pytest.skip(f"no Open MPI {which} here")
    probe = subprocess.run([python, "-c", "import mpi4py, numpy"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} has no mpi4py for Open MPI {which}")
    return program, python


def _drive(rig: simhosts.SimHosts, tmp_path: Path, which: str, mode: str,
           hide: list[Path], limits: dict | None = None) -> subprocess.CompletedProcess:
    program, python = _mpi(which)
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "drive.py").write_text(DRIVE)
    package = Path(simhosts.__file__).parent
    env = {**os.environ, "PYTHONPATH": str(package.parent), "SIMHOSTS_AGENT": str(rig.agent),
           "RIG_OPTIONS": json.dumps(rig.mpi_options(program)), "LIMITS": json.dumps(limits)}
    return rig.run("h1", [sys.executable, str(tmp_path / "drive.py"), program, python,
                          str(tmp_path / "job"), str(tmp_path / "rank.py"), mode,
                          *map(str, hide)], timeout=120, env=env, cwd=tmp_path)


@pytest.mark.parametrize("which", ["5", "4"], ids=["openmpi5", "openmpi4"])
def test_each_hosts_ranks_run_in_a_sandbox_of_that_host(sim_hosts, tmp_path, which):
    secret = tmp_path / "references" / "solution.py"
    secret.parent.mkdir()
    secret.write_text("SECRET")
    package = Path(simhosts.__file__).parent
    done = _drive(sim_hosts, tmp_path, which, "hello", [secret.parent, package])
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "RC 0" in done.stdout, out[-3000:]
    said = json.loads(next(ln for ln in done.stdout.splitlines()
                           if ln.startswith("HELLO "))[len("HELLO "):])
    assert [r["host"] for r in said] == ["h1", "h1", "h2", "h2"]
    # nothing hidden is found on either host: the references, the package, the controller's
    # own file, the rig's remote-start agent, the broker's socket (closed once h2 started)
    assert [r["seen"] for r in said] == [[]] * 4
    # one sandbox per host: the host's ranks share its PID namespace and /tmp, the other
    # host's are in another, and neither is the controller's
    controller = next(ln for ln in done.stdout.splitlines() if ln.startswith("PIDNS "))[6:]
    assert said[0]["pidns"] == said[1]["pidns"] != said[2]["pidns"] == said[3]["pidns"]
    assert controller not in {r["pidns"] for r in said}
    assert said[0]["userns"] == said[1]["userns"] != said[2]["userns"] == said[3]["userns"]
    assert [r["marks"] for r in said] == [["commbench-mark-0", "commbench-mark-1"]] * 2 + [
        ["commbench-mark-2", "commbench-mark-3"]] * 2
    assert _quiet(sim_hosts) == []


def test_each_hosts_sandbox_has_its_own_process_limit(sim_hosts, tmp_path):
    """300 processes per host's sandbox: a rank on each host starts 400 children at once;
    each gets most of its own host's 300 (the two together more than one limit would allow)
    and none gets past it: refused by the host's pids cgroup (or RLIMIT_NPROC), or counted,
    when the host's sandbox stops the job at its limit and says so."""
    done = _drive(sim_hosts, tmp_path, "5", "fork", [], limits={"pids_max": 300})
    out = done.stdout + done.stderr
    forked = {int(w[1]): (int(w[2]), w[3]) for w in (ln.split() for ln in out.splitlines())
              if w[:1] == ["FORKED"]}
    if forked.keys() == {0, 2}:  # the kernel refused the fork past each host's limit
        assert "RC 0" in done.stdout, out[-3000:]
        for count, error in forked.values():
            assert 150 < count < 300 and error == str(errno.EAGAIN), out[-3000:]
    else:  # a host's sandbox counted its processes and stopped the job
        assert f"RC {sandbox.LIMIT_EXIT}" in done.stdout, out[-3000:]
        assert "more than its limit of 300" in out, out[-3000:]
    assert _quiet(sim_hosts) == []


def test_a_host_that_stops_its_part_at_a_limit_ends_the_job_as_a_limit(sim_hosts, tmp_path):
    """No cgroup: the sandboxes count their processes (the host's uid is root here, whom
    RLIMIT_NPROC does not bind) or RLIMIT_NPROC refuses the fork; a host's sandbox that
    stops its part makes the job's status the limit's."""
    done = _drive(sim_hosts, tmp_path, "5", "fork", [], limits={"pids_max": 300,
                                                                  "cgroup": None})
    out = done.stdout + done.stderr
    if os.getuid() != 0:
        pytest.skip("RLIMIT_NPROC binds this user: the kernel refuses the fork, nothing stops")
    assert f"RC {sandbox.LIMIT_EXIT}" in done.stdout, out[-3000:]
    assert "[commbench sandbox] stopped the job: the job ran" in out, out[-3000:]
    assert _quiet(sim_hosts) == []


@pytest.mark.parametrize("which", ["5", "4"], ids=["openmpi5", "openmpi4"])
def test_a_sandboxed_rank_killed_on_the_second_host_ends_the_job_and_leaves_nothing(
        sim_hosts, tmp_path, which):
    done = _drive(sim_hosts, tmp_path, which, "die", [])
    out = done.stdout + done.stderr
    assert "rank 2 on h2 kills itself" in out, out[-3000:]
    assert "RC 0" not in done.stdout, out[-3000:]
    assert _quiet(sim_hosts) == [], "processes left on the hosts"


@pytest.mark.parametrize("which", ["5", "4"], ids=["openmpi5", "openmpi4"])
def test_every_hosts_sandbox_ends_with_its_controller(sim_hosts, tmp_path, which):
    done = _drive(sim_hosts, tmp_path, which, "sleep", [])
    up = next((ln for ln in done.stdout.splitlines() if ln.startswith("UP ")), "UP []")
    assert json.loads(up[3:]) == ["h1", "h1", "h2", "h2"], done.stdout + done.stderr
    assert done.returncode != 0  # the controller was killed
    assert _quiet(sim_hosts, 20.0) == [], "the job outlived its controller"


SPY = '''"""Ping-pong between ranks 0 and 1 of ctx.comm: one round trip per call."""

import numpy as np
from mpi4py import MPI


def pingpong(ctx, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
    comm: MPI.Comm = ctx.comm
    # >>> COMMBENCH EDIT pingpong
    # first look for what no job may see: the expert solution, the package, the controller's
    # project and its results, whatever the host
    import socket
    found = []
    for path in {look!r}:
        try:
            with open(path, "rb") as f:
                found.append((path, len(f.read())))
        except OSError:
            pass
    if found:
        raise RuntimeError(f"rank {{comm.Get_rank()}} on {{socket.gethostname()}} read {{found}}")
    rank = comm.Get_rank()
    if rank == 0:
        reply = comm.Irecv(recvbuf, source=1, tag=1)
        comm.Send(sendbuf, dest=1, tag=0)
        reply.Wait()
    elif rank == 1:
        comm.Recv(recvbuf, source=0, tag=0)
        comm.Send(sendbuf, dest=0, tag=1)
    # <<< COMMBENCH EDIT
'''


def test_a_rank_on_the_second_host_reads_nothing_a_job_may_not_see(bench, sim_hosts):
    """A solution whose ranks (one on each host) read the reference, the package, the
    controller's project files and an earlier job's output: sandboxed, nothing is found
    on either host and the item passes; without the sandboxes the same solution reads them
    (so the look is real)."""
    bench.add_task("p2p/pingpong", ranks=2)
    earlier = bench.root / "runs" / "earlier" / "work" / "item" / "sol0" / "out" / "answer.npy"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier job's output")
    look = [str(bench.root / "references" / "p2p" / "pingpong" / "solution.py"),
            str(Path(simhosts.__file__).parent / "observer.py"),
            str(bench.root / "pytest.ini"), str(earlier)]
    spy = bench.root / "spy"
    (spy / "p2p" / "pingpong").mkdir(parents=True)
    (spy / "p2p" / "pingpong" / "solution.py").write_text(SPY.format(look=look))
    result = _span_sandboxed(bench, sim_hosts, f"--commbench-model=dir:{spy}")
    (record,) = bench.records()
    assert record["verdict"] == "pass", (record["message"], result.stdout.str()[-2000:])
    assert record["hosts"] == ["h1", "h2"]
    assert _quiet(sim_hosts) == []
    result = _span_sandboxed(bench, sim_hosts, f"--commbench-model=dir:{spy}",
                             "--commbench-unsandboxed")
    control = bench.records()[-1]
    assert control["verdict"] == "runtime_error", control
    said = f"{control['message']}\\n{control.get('detail') or ''}"
    assert "read [(" in said and "solution.py" in said, said
    assert _quiet(sim_hosts) == []


@pytest.mark.parametrize("cheat", ["read_references", "read_other_jobs", "tamper_files_on_disk",
                                   "kill_launcher"])
def test_the_cheats_on_hidden_files_and_the_launcher_are_rejected_with_a_rank_on_each_host(
        bench, sim_hosts, cheat):
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    folder = repo / "fixtures" / "cheats" / cheat
    spec = tomllib.loads((folder / "cheat.toml").read_text())
    bench.add_task(spec["task"], ranks=2)
    result = _span_sandboxed(bench, sim_hosts, f"--commbench-model=dir:{folder}")
    (record,) = bench.records()
    assert record["verdict"] in spec["expect"], (record["verdict"], record["message"],
                                                 result.stdout.str()[-2000:])
    assert record["hosts"] == ["h1", "h2"]
    # nothing planted where the tampering cheat tries (the package, the references)
    planted = [p for tree in (repo / "pytest_commbench", bench.root / "references")
               for p in tree.rglob("*commbench_cheat_proof*")]
    assert planted == []
    assert _quiet(sim_hosts) == []


def test_a_hanging_item_over_the_hosts_is_killed_at_its_deadline_and_leaves_nothing(
        bench, sim_hosts):
    bench.add_task("collective/ring_allreduce", ranks=2)
    hang = Path(__file__).resolve().parents[2] / "fixtures" / "solutions" / "hang"
    _span_sandboxed(bench, sim_hosts, f"--commbench-model=dir:{hang}", "--commbench-timeout=5")
    (record,) = bench.records()
    assert record["verdict"] == "timeout", (record["verdict"], record["message"])
    assert record["hosts"] == ["h1", "h2"]
    # the job's session killed: every host's sandbox with it, the second host's included
    assert _quiet(sim_hosts) == [], "processes left on the hosts"


# -- the node agents (docs/cluster-design.md, "Part 2") ---------------------------------------

def _hanging_pingpong() -> str:
    """The reference ping-pong with its region replaced: each rank waits for a message its
    peer never sends (the test kills an agent meanwhile)."""
    text = (Path(__file__).parents[2] / "references/p2p/pingpong/solution.py").read_text()
    head, rest = text.split("    # >>> COMMBENCH EDIT pingpong\n")
    _body, tail = rest.split("    # <<< COMMBENCH EDIT\n")
    return (head + "    # >>> COMMBENCH EDIT pingpong\n"
            "    comm.Recv(recvbuf, source=1 - comm.Get_rank(), tag=99)\n"
            "    # <<< COMMBENCH EDIT\n" + tail)


def _agents_on(rig: simhosts.SimHosts, host: str) -> list[int]:
    """The pids (this process's view) of the node agents running on `host`."""
    found = []
    for pid in rig.processes(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"commbench_rank.agent" in argv:
            found.append(pid)
    return found


@pytest.mark.parametrize("sig, why", [(signal.SIGKILL, "closed the connection"),
                                      (signal.SIGSTOP, "nothing heard from it")],
                         ids=["killed", "silent"])
def test_a_killed_agent_ends_the_item_as_infra_error_and_leaves_nothing(bench, sim_hosts,
                                                                         tmp_path, sig, why):
    """The agent on h2 killed, or stopped (silent past the heartbeats' bound), while the
    ranks are in a call: the item is an infra_error saying so (whatever the ranks did), in
    its retry too, and nothing is left on either host."""
    bench.add_task("p2p/pingpong", ranks=2)
    answers = tmp_path / "answers"
    (answers / "p2p" / "pingpong").mkdir(parents=True)
    (answers / "p2p" / "pingpong" / "solution.py").write_text(_hanging_pingpong())
    launcher = shlex.join([str(sim_hosts.launcher()), *sim_hosts.mpi_options()])
    env = {**os.environ, **sim_hosts.controller_env(), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")]))}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "--platform=cpu",
         "--commbench-unsandboxed", f"--commbench-launcher={launcher}",
         f"--commbench-hostfile={sim_hosts.hostfile}", "--commbench-ranks-per-node=1",
         f"--commbench-model=dir:{answers}"],
        cwd=bench.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        killed: set[int] = set()
        while time.monotonic() < deadline and run.poll() is None:
            # once the ranks are in the call (the solution loaded), the agent on h2 goes; in
            # the item's retry (an infra_error is retried once) as well
            if any("case" in p.read_text(errors="replace")
                   for p in bench.root.glob("runs/*/work/**/out/status_r1.json")):
                for pid in set(_agents_on(sim_hosts, "h2")) - killed:
                    os.kill(pid, sig)
                    killed.add(pid)
            time.sleep(0.05)
        assert killed, "no agent was seen on h2"
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    (record,) = [r for r in bench.records() if r["event"] == "result"] or [None]
    assert record is not None, out.decode(errors="replace")[-3000:]
    assert record["verdict"] == "infra_error", record
    assert record["message"].startswith("the agent on node h2 ended"), record["message"]
    assert why in record["message"]
    assert _quiet(sim_hosts) == []


FORGER = r"""
import json, os, socket, struct, sys
sys.path.insert(0, sys.argv[4])
from pytest_commbench.rank import wire
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
head = b""  # the controller's challenge, whole (its frame and its MAC may come apart)
while len(head) < 4 or len(head) < 4 + struct.unpack("!I", head[:4])[0] + wire.MAC_BYTES:
    got = sock.recv(4096)
    if not got:
        sys.exit("the controller closed before its challenge")
    head += got
length, code, hlen = struct.unpack("!IBI", head[:9])
said = json.loads(head[9:9 + hlen])
mode = sys.argv[3]
if mode == "forged":  # a HELLO framed as an agent's, made with a key of its own
    ch = wire.Channel(sock, os.urandom(32), "agent", "the controller")
    ch.nonce = bytes.fromhex(said["nonce"]); ch.got = 1
    ch.send("HELLO", {"node": 1, "nonce": os.urandom(32).hex(),
                      "answer": wire.answer(os.urandom(32), ch.nonce, "x", 1)})
elif mode == "garbage":
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
# (silent: says nothing at all)
try:
    rest = sock.recv(4096)
except socket.timeout:
    rest = b"(still open)"
print("CLOSED" if rest == b"" else f"ANSWERED {rest[:40]!r}", flush=True)
"""


@pytest.mark.parametrize("mode", ["forged", "garbage", "silent"])
def test_a_connection_without_the_job_s_key_is_refused(sim_hosts, tmp_path, monkeypatch,
                                                        mode):
    """The controller's port for the agents, reached from h2 over the hosts' network by a
    process without the job's key: its HELLO forged with another key, bytes that are no
    frame, or silence past the handshake's time; each connection is closed unread and no
    agent is admitted."""
    from types import SimpleNamespace

    from pytest_commbench import cluster

    for name, value in sim_hosts.controller_env().items():
        monkeypatch.setenv(name, value)
    job_dir = tmp_path / "job"
    (job_dir / "ro").mkdir(parents=True)
    hub = cluster.RemoteRanks(SimpleNamespace(), job_dir, 2, False, ["h1", "h2"], "job-x")
    script = tmp_path / "forger.py"
    script.write_text(FORGER)
    try:
        forger = subprocess.Popen(
            sim_hosts.command("h2", [sys.executable, str(script), hub.address, str(hub.port),
                                     mode, str(Path(__file__).parents[2])]),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 30
        while forger.poll() is None and time.monotonic() < deadline:
            hub._admit()
            time.sleep(0.01)
        out, _ = forger.communicate(timeout=30)
    finally:
        hub.close()
    assert out.decode().strip().endswith("CLOSED"), out.decode()
    assert hub.agents == {}
    assert _quiet(sim_hosts) == []


@pytest.mark.parametrize("cheat", ["early_done_thread", "frame_gc_introspection",
                                   "crash_controller_memfd", "forge_timing_files"])
def test_cheats_are_caught_through_the_agents_as_on_one_node(bench, sim_hosts, cheat):
    """Cheats that race the observer (an early "done", the harness's own word written, a
    segment truncated, forged status files) with a rank on each host: the agents catch them
    as the observer does on one node (the verdict the cheat's folder expects)."""
    import tomllib

    folder = Path(__file__).parents[2] / "fixtures" / "cheats" / cheat
    spec = tomllib.loads((folder / "cheat.toml").read_text())
    bench.add_task(spec["task"], ranks=2)
    _span(bench, sim_hosts, f"--commbench-model=dir:{folder}")
    (record,) = bench.records()
    assert record["verdict"] in spec["expect"], (record["verdict"], record["message"])
    assert record["hosts"] == ["h1", "h2"] and set(record["clock_skew_us"]) == {"h1", "h2"}
    assert _quiet(sim_hosts) == []
