"""A suite spread over a cluster, under a real Slurm: Debian's `slurm-wlm` and `munge` (one
`munged`, one `slurmctld` and one `slurmd` on this machine, started by the test in a folder of
its own, on free ports of the loopback address) run a job array of two shards of the CPU
suite, and `commbench report` merges them into the verdicts of an unsharded run; an item's
ranks launched by srun, unsandboxed and each in a sandbox of its own.

Skipped, saying why, where the daemons are not installed, the test is not root (slurmd runs
its jobs as root) or they cannot start here. Every daemon and every process of its jobs is
stopped, and the folder removed, at the end, failed or not."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pytest_commbench import sandbox, sandbox_init
from pytest_commbench.results import load

REPO = Path(__file__).resolve().parents[2]
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
# a few tasks of the suite: 9 items of 5 tasks, of which 3 run on the CPU (a few seconds each)
# and 6 are skipped there (GPU tasks of three world sizes each, split with their task too)
SELECTION = "pingpong or ring_allreduce or binomial_bcast"
START_S = 30  # for each daemon to come up
JOBS_S = 300  # for the job array to end


def _which(name: str) -> str | None:
    return shutil.which(name, path=SBIN)


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on, of the loopback address (held together while chosen)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _node() -> tuple[str, int]:
    """This machine as slurmd sees it: its name and CPUs (`slurmd -C`)."""
    done = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30)
    name = re.search(r"NodeName=(\S+)", done.stdout)
    cpus = re.search(r"\bCPUs=(\d+)", done.stdout)
    if done.returncode or not name or not cpus:
        pytest.skip(f"slurmd -C cannot describe this machine: {done.stderr.strip()[-300:]}")
    return name[1], int(cpus[1])


def _clean_env() -> dict[str, str]:
    """This process's environment less anything of an allocation around it or of the
    benchmark's and pytest's own settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "COMMBENCH_", "PYTEST_"))}


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _until(what, seconds: float, step: float = 0.5):
    """what() until it is true, for at most `seconds`; its last value."""
    end = time.monotonic() + seconds
    while True:
        value = what()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


class Cluster:
    """munged, slurmctld and slurmd in `root`, on the loopback address."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = root / "etc" / "slurm.conf"
        self.env = {**_clean_env(), "SLURM_CONF": str(self.conf), "PATH": SBIN}
        self.marker = f"SLURM_CONF={self.conf}".encode()

    def slurm(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([_which(args[0]) or args[0], *args[1:]], capture_output=True,
                              text=True, timeout=timeout, env=self.env)

    def _daemon(self, name: str, argv: list[str], ready, why: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed by the child's end
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()
        if not _until(lambda: self.procs[name].poll() is not None or ready(), START_S) \
                or self.procs[name].poll() is not None:
            pytest.skip(f"Slurm cannot start here: {name} {why} "
                        f"({_tail(self.root / 'log' / f'{name}.out', 600)!r})")

    def start(self) -> None:
        host, cpus = _node()
        ctld_port, slurmd_port = _free_ports(2)
        for sub, mode in (("etc", 0o755), ("munge", 0o755), ("key", 0o700), ("state", 0o700),
                          ("spool", 0o755), ("log", 0o755)):
            (self.root / sub).mkdir(mode=mode)
            os.chmod(self.root / sub, mode)
        key = self.root / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = self.root / "munge" / "munge.socket"
        r = self.root
        self.conf.write_text(f"""\
ClusterName=commbench
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'state' / 'slurmctld.pid'}
SlurmdPidFile={r / 'state' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=commbench Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon("munged", [_which("munged"), "--foreground", f"--key-file={key}",
                                f"--socket={sock}", f"--pid-file={r / 'munge' / 'munged.pid'}",
                                f"--log-file={r / 'log' / 'munged.log'}",
                                f"--seed-file={r / 'key' / 'munged.seed'}"],
                     sock.exists, "did not open its socket")
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)],
                     lambda: "UP" in self.slurm("scontrol", "ping").stdout,
                     "did not answer scontrol ping")
        self._daemon("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", host],
                     lambda: self.slurm("sinfo", "-h", "-n", host, "-o", "%T").stdout.strip()
                     .rstrip("*") == "idle", f"did not bring node {host} up")

    def stop(self) -> None:
        """Cancel every job, stop the daemons, end whatever of theirs is left (the
        processes whose environment names this cluster's settings), remove the folder."""
        with contextlib.suppress(Exception):
            if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
                self.slurm("scancel", "--quiet", "--full", "--partition=commbench")
                _until(lambda: not self.slurm("squeue", "-h").stdout.strip(), 30, 1)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)
        for _ in range(3):  # slurmstepd, slurmscriptd, a job's processes
            left = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
                    and _environ_has(int(p), self.marker)]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(1)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def cluster():
    missing = [b for b in (*DAEMONS, *CLIENTS) if _which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}: Debian's slurm-wlm "
                    "and munge packages)")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs its jobs as root: the Slurm test needs root")
    # not pytest's tmp_path: munged wants every folder above its socket open to all
    root = Path(tempfile.mkdtemp(prefix="commbench-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    cluster = Cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _verdicts(folder: Path) -> dict[str, str]:
    return {r["nodeid"]: r["verdict"] for r in load(folder / "results.jsonl")}


def _rows(text: str) -> list[str]:
    """The lines of a report that are items (its table of tasks)."""
    return sorted(line for line in text.splitlines() if re.match(r"(collective|p2p)/\S+ +\d", line))


def test_a_two_shard_job_array_under_slurm_merges_into_the_unsharded_verdicts(cluster):
    root = cluster.root
    pytest_args = ["-m", "pytest", "suites", "-p", "no:cacheprovider", "--platform=cpu",
                   "--commbench-model=reference", "--commbench-check-only", "-k", SELECTION]
    script = root / "shards.sbatch"
    script.write_text(f"""\
#!/bin/bash
#SBATCH --job-name=commbench-shards
#SBATCH --array=0-1
#SBATCH --cpus-per-task=1
#SBATCH --time=10
#SBATCH --chdir={REPO}
#SBATCH --output={root}/shard-%A_%a.out
exec {sys.executable} {' '.join(pytest_args[:-1])} "{SELECTION}" \\
  --commbench-shard=$((SLURM_ARRAY_TASK_ID+1))/2 --commbench-runs-dir={root}/runs
""")
    submitted = cluster.slurm("sbatch", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    # meanwhile, the unsharded run outside Slurm (its own runs folder)
    whole = subprocess.run([sys.executable, *pytest_args, f"--commbench-runs-dir={root}/whole"],
                           cwd=REPO, env=_clean_env(), capture_output=True, text=True,
                           timeout=JOBS_S)
    assert whole.returncode == 0, whole.stdout[-3000:]
    ended = _until(lambda: not cluster.slurm("squeue", "-h", "-j", job).stdout.strip(), JOBS_S, 1)
    outputs = "\n".join(f"--- {p.name}\n{_tail(p, 2500)}" for p in sorted(root.glob("shard-*.out")))
    assert ended, f"the job array did not end within {JOBS_S} s:\n{outputs}"
    shown = cluster.slurm("scontrol", "-o", "show", "job", job).stdout
    codes = re.findall(r"ArrayTaskId=(\d+) .*?ExitCode=(\S+)", shown)
    assert sorted(codes) == [("0", "0:0"), ("1", "0:0")], f"{shown}\n{outputs}"

    runs = sorted(p.parent for p in (root / "runs").glob("*/results.jsonl"))
    infos = [json.loads((r / "run.json").read_text()) for r in runs]
    assert sorted(i["shard"] for i in infos) == ["1/2", "2/2"]
    assert {i["run_name"] for i in infos} == {f"slurm-{job}"}  # the array's job id
    parts = [_verdicts(r) for r in runs]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    (unsharded,) = [p.parent for p in (root / "whole").glob("*/results.jsonl")]
    assert {**parts[0], **parts[1]} == _verdicts(unsharded)
    assert set(_verdicts(unsharded).values()) == {"pass", "skipped"}

    report = [sys.executable, "-m", "pytest_commbench.cli", "report"]
    merged = subprocess.run([*report, str(root / "runs")], capture_output=True, text=True,
                            timeout=120, env=_clean_env())
    alone = subprocess.run([*report, str(unsharded)], capture_output=True, text=True,
                           timeout=120, env=_clean_env())
    assert merged.returncode == alone.returncode == 0, merged.stderr + alone.stderr
    assert f"run slurm-{job} (model reference): its 2 shards merged" in merged.stderr
    assert _rows(merged.stdout) == _rows(alone.stdout) and len(_rows(alone.stdout)) == 3
    headline = [line for line in merged.stdout.splitlines() if line.startswith("Pass Rate")]
    assert headline == [line for line in alone.stdout.splitlines()
                        if line.startswith("Pass Rate")]
    assert headline[0].startswith("Pass Rate 100.0% (3/3)") and "PARTIAL" not in headline[0]


def _pmix_or_skip(cluster: Cluster) -> None:
    probe = cluster.slurm("srun", "-n", "1", "--mpi=pmix", "true", timeout=60)
    if "can not load PMIx library" in probe.stderr:
        pytest.skip("Slurm's PMIx plugin cannot load the PMIx library here (Debian's "
                    "libpmix-dev ships the pmix2/lib/libpmix.so it opens)")


def _shared_shm() -> set[str]:
    """The ranks' shared /dev/shm folders of this host (sandbox.rank_plan's)."""
    return {p.name for p in Path(sandbox.SHM_ROOT).glob("commbench-shm-*")}


def _srun_item(cluster: Cluster, label: str, model: str, selection: str, *extra: str,
               tasks: int = 2) -> tuple[Path, str]:
    """Run the items of `selection` in a Slurm job of `tasks` tasks (more than the node's
    CPUs: overcommitted), their ranks launched by srun; the run's results log and the job's
    output."""
    root = cluster.root
    script = root / f"{label}.sbatch"
    script.write_text(f"""\
#!/bin/bash
#SBATCH --ntasks={tasks}
#SBATCH --overcommit
#SBATCH --time=10
#SBATCH --chdir={REPO}
#SBATCH --output={root}/{label}.out
exec {sys.executable} -m pytest suites -p no:cacheprovider --platform=cpu -rs \\
  --commbench-model={model} --commbench-check-only -k "{selection}" \\
  --commbench-launcher=srun {' '.join(extra)} --commbench-runs-dir={root}/runs-{label}
""")
    submitted = cluster.slurm("sbatch", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    ended = _until(lambda: not cluster.slurm("squeue", "-h", "-j", job).stdout.strip(),
                   JOBS_S, 1)
    out = _tail(root / f"{label}.out", 3000)
    assert ended, f"the {label} job did not end within {JOBS_S} s:\n{out}"
    (log,) = (root / f"runs-{label}").glob("*/results.jsonl")
    return log, out


def test_srun_launches_an_items_ranks_under_slurm_unsandboxed_and_each_in_a_sandbox(cluster):
    """`--commbench-launcher=srun` inside a job of two tasks: srun --mpi=pmix starts the
    ranks through slurmd (Open MPI's ranks wire up through Slurm's PMIx), and the item
    passes, each rank's host recorded: unsandboxed, and sandboxed (each rank in a sandbox of
    its own that slurmd starts, srun outside: the ranks reach their PMIx server and share
    their node's /dev/shm folder, which the last of them removes)."""
    _pmix_or_skip(cluster)
    before = _shared_shm()
    for label, extra in (("unsandboxed", "--commbench-unsandboxed"), ("sandboxed", "")):
        log, out = _srun_item(cluster, label, "reference", "p2p and pingpong and not flag",
                              extra)
        (record,) = [r for r in load(log) if r["task"] == "p2p/pingpong"]
        assert record["verdict"] == "pass", (label, record.get("message"), out)
        assert len(record["hosts"]) == 2 and len(set(record["hosts"])) == 1, record
    assert _shared_shm() <= before, "a job's shared /dev/shm folder was left behind"


def test_a_sandboxed_srun_rank_cannot_see_what_the_sandbox_hides(cluster):
    """The cheat that looks for the references (the project, the package's own path from
    PID 1's command line, a walk of the usual trees) and runs the expert's solution, its four
    ranks started by srun each in a sandbox: it finds nothing, as under mpirun, and ends
    with a verdict that is no pass."""
    import tomllib

    _pmix_or_skip(cluster)
    before = _shared_shm()
    folder = REPO / "fixtures" / "cheats" / "read_references"
    spec = tomllib.loads((folder / "cheat.toml").read_text())
    task = spec["task"]
    log, out = _srun_item(cluster, "cheat", f"dir:{folder}",
                          f"{task.split('/')[0]} and {task.split('/')[1]}", tasks=4)
    (record,) = [r for r in load(log) if r["task"] == task]
    said = f"{record.get('message')}\n{record.get('detail')}\n{record.get('output')}"
    assert record["verdict"] in spec["expect"], (record["verdict"], said, out)
    # it found nothing, so wrote nothing (unsandboxed it finds the references, and the
    # guard of what the task forbids stops the expert's code it loads: forbidden)
    assert record["verdict"] == "wrong_answer", (said, out)
    assert "[cheat] using" not in said and "references/collective" not in said, said
    assert len(record["hosts"]) == record["world"] == 4, record
    # the controller stopped the job at its wrong answer: slurmd killed the ranks' sandboxes
    # (SIGKILL), which left their node's /dev/shm folder; no sandbox holds it, and the next
    # sandbox on the node removes it once it has been untouched for SHM_STALE_S
    parent = os.open(sandbox.SHM_ROOT, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sandbox_init.sweep_shm(parent, "", now=time.time() + sandbox_init.SHM_STALE_S + 1)
    finally:
        os.close(parent)
    assert _shared_shm() <= before


def test_jobs_see_the_batch_systems_settings_named_by_slurm_conf(tmp_path):
    """Inside an allocation Open MPI's mpiexec runs srun, which reads SLURM_CONF: a job's
    sandbox keeps its folder, wherever it is."""
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("ClusterName=x\n")
    assert str(conf.parent) in sandbox.system_keep({"SLURM_CONF": str(conf)})
    assert str(conf.parent) not in sandbox.system_keep({})
