"""The job sandbox, controller side: what a job may see, and the command that builds it.

Every job (launcher and ranks) runs in fresh user, mount and PID namespaces built by
`sandbox_init.py` (util-linux `unshare` does the unsharing). The job's root is an empty
tmpfs into which only an allow-list is bound: the system trees (`SYSTEM_TREES`), what of
/etc programs need (`ETC_KEEP`: no shadow file, key or registry setting), the Python
environment (`python_roots()`), the trees a job's libraries need (`keep`, by default
`system_keep()`), /dev, /sys, a /proc of the job's own, fresh /tmp, /var/tmp, /dev/shm and
/run, and the job's folder. Nothing else of the host's filesystem exists inside. What `hide`
names (the package, the references, the runs and scratch roots with every other item's and
job's files, the project tree) is subtracted where it lies inside a kept tree. `probe()`
says once per process whether namespaces work here; where they do not, an item is
`infra_error` with the reason unless the user passed `--commbench-unsandboxed`. A job whose
ranks run on other nodes has one sandbox per node (`wrap_over_nodes`: mpirun's here, its
daemon's on each other node, started outside by `remote_start.py`'s broker). A job whose
ranks srun starts has one sandbox per rank, started by slurmd (`rank_wrap`, `rank_plan`),
srun outside.

A job's limits travel in its plan (`default_limits`, any of them changed by `plan`'s
`limits`): `pids_max` processes and threads for the whole job (a pids cgroup of its own
where `pids_cgroup()` finds one this process may write, else RLIMIT_NPROC, else a count by
the sandbox's first process: `sandbox_init` says which applies where and what remains),
`tmpfs_bytes` for each of /tmp, /var/tmp, /dev/shm and /run, and for the job's folder on the
host's disk `fsize_bytes` per file, `scratch_bytes` and `scratch_files` in all, and
`disk_reserve_bytes` of the disk that a job may not take. A job stopped at a limit ends with
`LIMIT_EXIT` and says why on its output.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import sandbox_init
from .launch import drained, find_mpiexec
from .rank.protocol import LIMIT_EXIT, SANDBOX_FAILED
from .remote_start import CONFIG as REMOTE_CONFIG

INIT = Path(__file__).with_name("sandbox_init.py")
# sandbox_init's exit codes (its own copies; rank/protocol.py spells them for the controller)
SETUP_FAILED, LIMIT_EXIT = SANDBOX_FAILED, LIMIT_EXIT
MiB, GiB = 1 << 20, 1 << 30
PIDS_MAX = 2048  # processes and threads of one job (8 GPU ranks need a few hundred)
SCRATCH_BYTES = 2 * GiB  # what a job may write into its folder, and its largest file
SCRATCH_FILES = 100_000  # files and folders a job may make in its folder
CGROUP_PREFIX = "commbench-"
PACKAGE = Path(__file__).resolve().parent
# what any program needs (bound read-only where they exist; a symbolic link, e.g. /bin ->
# usr/bin on a merged-/usr system, is made again as a link)
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# of the host's /etc only what the dynamic loader, the name service, MPI and its transports,
# the GPU stacks and the compilers read (each bound read-only where it exists): never
# shadow files, keys, tokens, package-manager or registry settings (pip.conf, npmrc,
# gitconfig), ssh, munge; a host file an answer could include or read is not in any job or
# build. A link among them is made again as the link it is, and the file it leads to is
# bound (/etc/localtime -> /usr/share/zoneinfo/...)
ETC_KEEP = (
    # the loader
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    # the name service: users and groups by name (no passwords: those live in shadow),
    # hosts, services
    "nsswitch.conf", "passwd", "group", "hosts", "host.conf", "gai.conf", "hostname",
    "resolv.conf", "services", "protocols", "networks", "rpc",
    # time, the system's name
    "localtime", "timezone", "os-release", "debian_version",
    # alternatives (mpirun, compilers on Debian) and MPI, PMIx, UCX, verbs, Slurm's settings
    "alternatives", "openmpi", "pmix", "prrte", "mpich", "ucx", "libibverbs.d", "rdma",
    "slurm",
    # GPU stacks and compilers
    "nccl.conf", "nvidia", "OpenCL", "clang",
)
# variables that name where a toolkit or MPI lives
PREFIX_VARS = ("CUDA_HOME", "CUDA_PATH", "OPAL_PREFIX", "MPI_HOME", "NCCL_HOME",
               "NVSHMEM_HOME", "UCX_HOME", "ROCM_PATH", "HIP_PATH")


def unshare_argv() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    return [exe, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
            "--mount-proc"]


def _abs(path: str | os.PathLike) -> str:
    """Absolute, without resolving symbolic links (the sandbox makes them again)."""
    return os.path.abspath(os.fspath(path))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def python_roots() -> list[str]:
    """Trees the ranks' Python needs: the interpreter's prefixes and site-packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    return sorted(_abs(r) for r in roots if r)


def _loader_folders(conf: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The library folders the dynamic loader is configured with (its cache names their
    libraries, so a job must see them)."""
    found: list[str] = []
    try:
        lines = Path(conf).read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include") and depth < 3:
            pattern = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
            pattern = pattern if pattern.startswith("/") else os.path.join(
                os.path.dirname(conf), pattern)
            for sub in sorted(glob.glob(pattern)):
                found += _loader_folders(sub, depth + 1)
        elif line.startswith("/"):
            found.append(line)
    return found


def system_keep(env: Mapping[str, str] | None = None) -> list[str]:
    """The trees besides the system's own that a job usually needs on this machine, where
    they exist: the CUDA toolkits and driver folders under /usr/local, ROCm's /opt/rocm*,
    /usr/local/lib and /usr/local/bin, the prefix of the MPI in use (its `mpiexec`, daemons,
    components and help files), the prefixes the job's environment names (CUDA_HOME,
    OPAL_PREFIX, ROCM_PATH, ...), the folders of the job's LD_LIBRARY_PATH and those the
    dynamic loader is configured with (/etc/ld.so.conf: e.g. /opt/amazon/efa/lib for NCCL's network plugin)."""
    env = os.environ if env is None else env
    found = ["/usr/local/bin", "/usr/local/lib", "/usr/local/nvidia",
             *sorted(glob.glob("/usr/local/cuda*")), *sorted(glob.glob("/opt/rocm*"))]
    mpiexec = find_mpiexec()
    if mpiexec:
        found.append(str(Path(mpiexec).resolve().parent.parent))
    found += [env[v] for v in PREFIX_VARS if env.get(v)]
    if env.get("SLURM_CONF"):  # inside an allocation mpiexec asks srun, which reads it
        found.append(os.path.dirname(_abs(env["SLURM_CONF"])))
    found += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    found += _loader_folders()
    kept = [_abs(p) for p in found if os.path.isabs(p) and os.path.exists(p)]
    return [p for p in dict.fromkeys(kept) if os.path.realpath(p) != "/"]


def memory_bytes() -> int:
    """The memory this process's jobs have: the machine's, or less where a memory cgroup
    (v2 `memory.max` or v1 `memory.limit_in_bytes`) of this process says so."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return total
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":
            files = [f"/sys/fs/cgroup{path}/memory.max"]
        elif "memory" in controllers.split(","):
            files = [f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"]
        else:
            continue
        for file in files:
            try:
                text = Path(os.path.normpath(file)).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and 0 < int(text) < total:
                total = int(text)
    return total


def tmpfs_sizes(ram: int | None = None) -> dict[str, int]:
    """Bytes of each fresh tmpfs of a job: a sixteenth of the memory each, /run at most
    256 MiB; /dev/shm (NCCL's and MPS's shared memory: a few hundred MiB per job at most)
    never less than 1 GiB or a quarter of the memory, whichever is smaller."""
    ram = memory_bytes() if ram is None else ram
    part = max(64 * MiB, ram // 16)
    return {"/tmp": part, "/var/tmp": part, "/run": min(part, 256 * MiB),
            "/dev/shm": max(part, min(GiB, ram // 4))}


def disk_reserve(folder: Path | str) -> int:
    """Bytes of the disk holding `folder` that no job may take: 5% of it, at most 2 GiB
    (the results log, the next items and everyone else need the rest)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return min(2 * GiB, st.f_blocks * st.f_frsize // 20)


def _cgroup_mounts() -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(mount point, root) of the cgroup v2 hierarchy and of the v1 `pids` one, if any."""
    v2 = v1 = None
    try:
        lines = Path("/proc/self/mountinfo").read_bytes().splitlines()
    except OSError:
        return None, None
    for line in lines:
        head, _, tail = line.partition(b" - ")
        fields, extra = head.split(b" "), tail.split(b" ")
        if len(fields) < 5 or len(extra) < 3:
            continue
        root, point = os.fsdecode(fields[3]), os.fsdecode(fields[4])
        if "\\" in point or "\\" in root:
            continue  # an escaped name: not a cgroup mount this looks for
        if extra[0] == b"cgroup2" and v2 is None:
            v2 = (point, root)
        elif extra[0] == b"cgroup" and b"pids" in extra[2].split(b",") and v1 is None:
            v1 = (point, root)
    return v2, v1


def _cgroup_dir(mount: tuple[str, str], path: str) -> str | None:
    point, root = mount
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return None
        path = path[len(root.rstrip("/")):] or "/"
    return os.path.normpath(point + "/" + path.lstrip("/"))


def _writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK) and \
        os.access(os.path.join(folder, "cgroup.procs"), os.W_OK)


@functools.lru_cache(maxsize=1)
def pids_cgroup() -> dict[str, Any] | None:
    """Where a job's pids cgroup can be made by this process: a cgroup v2 whose
    `cgroup.subtree_control` has `pids` and that this process may write (a delegation: this
    process's own cgroup, or its parent, as the no-internal-process rule allows), else this
    process's cgroup in the v1 `pids` hierarchy where it may write there; None if neither."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2, v1 = _cgroup_mounts()
    found = None
    for line in own:
        _id, controllers, path = line.split(":", 2)
        if controllers == "" and v2 is not None and found is None:
            here = _cgroup_dir(v2, path)
            for parent in ([here, os.path.dirname(here)] if here else []):
                if not _inside(parent, v2[0]):
                    continue
                try:
                    control = Path(parent, "cgroup.subtree_control").read_text().split()
                except OSError:
                    continue
                if "pids" in control and _writable(parent):
                    found = {"version": 2, "parent": parent}
                    break
    for line in own:
        _id, controllers, path = line.split(":", 2)
        if found is None and v1 is not None and "pids" in controllers.split(","):
            here = _cgroup_dir(v1, path)
            if here and _writable(here):
                found = {"version": 1, "parent": here}
    return found


def _sweep(parent: str) -> None:
    """Remove the empty cgroups this process's earlier jobs left and those of controllers
    that are gone (a job killed from outside, at its deadline or with its controller, leaves
    its cgroup behind; one still in use is never empty, and rmdir refuses it)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        found = re.fullmatch(re.escape(CGROUP_PREFIX) + r"(\d+)-[0-9a-f]+", name)
        if not found:
            continue
        if int(found.group(1)) != os.getpid():
            try:
                os.kill(int(found.group(1)), 0)
                continue  # its controller lives: its job may be about to join it
            except ProcessLookupError:
                pass
            except OSError:
                continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            pass  # not empty (yet): the next sweep


def default_limits(job_dir: Path | str) -> dict[str, Any]:
    """A job's limits on this machine (see the module's docstring)."""
    found = pids_cgroup()
    if found is not None:
        _sweep(found["parent"])
    return {
        "pids_max": PIDS_MAX,
        "cgroup": None if found is None else
        {**found, "name": f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"},
        "tmpfs_bytes": tmpfs_sizes(),
        "fsize_bytes": SCRATCH_BYTES,
        "scratch_bytes": SCRATCH_BYTES,
        "scratch_files": SCRATCH_FILES,
        "disk_reserve_bytes": disk_reserve(job_dir),
        "data_bytes": None,  # no per-process memory limit (GPU ranks map much): compilers get one
    }


def limits_for(job_dir: Path | str, limits: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`default_limits` with what `limits` changes: a value of None lifts that limit (or,
    for `cgroup`, uses none); `tmpfs_bytes` may be one size for every mount or some of them
    by path."""
    merged = default_limits(job_dir)
    for key, value in (limits or {}).items():
        if key == "tmpfs_bytes" and value is not None:
            sizes = value if isinstance(value, Mapping) else dict.fromkeys(merged[key], value)
            merged[key] = {**merged[key], **{k: int(v) for k, v in sizes.items()}}
        else:
            merged[key] = value
    return merged


def plan(job_dir: Path, argv: list[str], env: dict[str, str], hide: Iterable[Path],
         keep: Iterable[Path | str] | None = None,
         limits: Mapping[str, Any] | None = None, also_keep: Iterable[Path | str] = ()) -> dict:
    """The JSON plan `sandbox_init.py` builds the job's view from.

    `keep`: trees bound read-only besides the system trees and the Python environment; None
    means `system_keep(env)` less what of it lies in a hidden tree (a library folder inside
    the project stays hidden); `also_keep` is kept besides (a compiler's include folders).
    What `keep` and `also_keep` name and the Python environment stay visible inside a hidden
    tree (a virtual environment inside the project); what `hide` names is hidden where it
    lies inside a kept tree. `limits`: changes to `default_limits`."""
    hidden = sorted({str(PACKAGE), *(os.path.realpath(h) for h in hide)})
    if keep is None:
        extra = [k for k in system_keep(env)
                 if not any(_inside(os.path.realpath(k), h) for h in hidden)]
    else:
        extra = [_abs(k) for k in keep]
    extra += [_abs(k) for k in also_keep]
    kept = [t for t in SYSTEM_TREES if os.path.lexists(t)]
    kept += [f"/etc/{n}" for n in ETC_KEEP if os.path.lexists(f"/etc/{n}")]
    kept += [k for k in dict.fromkeys([*python_roots(), *extra]) if k not in kept]
    return {"job": _abs(job_dir), "argv": drained(argv), "env": env, "hide": hidden,
            "keep": kept, "limits": limits_for(job_dir, limits)}


def wrap(job_dir: Path, argv: list[str], env: dict[str, str], hide: Iterable[Path],
         keep: Iterable[Path | str] | None = None,
         limits: Mapping[str, Any] | None = None, also_keep: Iterable[Path | str] = ()) -> list[str]:
    """The command that runs `argv` inside the job's sandbox (see `plan` for `keep`,
    `also_keep` and `limits`)."""
    prefix = unshare_argv()
    if prefix is None:
        raise RuntimeError("unshare (util-linux) is not installed")
    spec = plan(job_dir, argv, env, hide, keep, limits, also_keep)
    return [*prefix, sys.executable, "-I", "-S", str(INIT), json.dumps(spec)]


#: what of its own environment a rank's sandbox takes from the daemon that started it
#: (sandbox_init's `inherit`): who wins where the plan names the variable too
RANK_INHERIT = {"SLURM_*": "launcher", "SLURMD_*": "launcher", "PMIX_*": "launcher",
                "PMI_*": "launcher", "FLUX_*": "launcher", "OMPI_*": "plan",
                "CUDA_VISIBLE_DEVICES": "launcher", "ROCR_VISIBLE_DEVICES": "launcher",
                "HIP_VISIBLE_DEVICES": "launcher", "GPU_DEVICE_ORDINAL": "launcher"}
#: the variables naming the PMIx server's folders a rank reaches (sandbox_init's
#: `bind_env`), read-only: the job step's own (Slurm's SlurmdSpoolDir/pmix.JOB.STEP/: the
#: shared store of PMIx 4's ds12/ds21). A PMIx 4 client would write the store's lock files:
#: read-only, it says "PMIX ERROR ... gds_ds12_lock_pthread.c" once and fetches what it
#: needs over its connection instead (Open MPI 5's own PMIx has no such store); writable,
#: a rank could fill slurmd's spool disk. Its rendezvous is the TCP address in
#: PMIX_SERVER_URI*. Not PMIX_SYSTEM_TMPDIR: a client given its server's URI never looks
#: there, and it is where system-wide servers leave their rendezvous for tools (here it is
#: /tmp, which stays the rank's own)
RANK_BIND_ENV = {"PMIX_SERVER_TMPDIR": "ro", "PMIX_DSTORE_21_BASE_PATH": "ro",
                 "PMIX_DSTORE_ESH_BASE_PATH": "ro"}
#: the variables whose value is a rank's PID in its sandbox (sandbox_init's `pid_env`): the
#: task's PID on the host, unique on the node (Open MPI's shared memory needs the ranks of a
#: node to have PIDs of their own)
RANK_PID_ENV = ("SLURM_TASK_PID",)
#: the rank plan's file in the job's ro/, and the folder of each node's /dev/shm its ranks share
RANK_PLAN = "sandbox-rank.json"
SHM_ROOT = "/dev/shm"


def no_single_copy(env: Mapping[str, str], major: int | None) -> dict[str, str]:
    """Open MPI's settings that turn its single copy between ranks of one node (CMA) off:
    process_vm_readv needs the peer's PID and ptrace rights, which ranks in sandboxes of
    their own (PID and user namespaces of their own) do not have. (Open MPI 5.0's smsc/cma
    sees the peer in another user namespace and stays off by itself: a job with
    OMPI_MCA_smsc=cma forced passes; the setting says so for every version.) The user's
    choice stays."""
    if major == 4:
        key, value = "OMPI_MCA_btl_vader_single_copy_mechanism", "none"
    else:
        key, value = "OMPI_MCA_smsc", "^cma"
    return {} if key in env else {key: value}


def rank_wrap(job_dir: Path) -> list[str]:
    """The words put before each rank's program where a batch system's launcher (srun)
    starts the ranks: each rank in a sandbox of its own, `sandbox_init.py @PLAN -- PROGRAM`,
    the plan (`rank_plan`, written before the job starts) in the job's `ro/`, which no
    sandbox can change, and sandbox_init a copy there (the package may not be on the ranks'
    nodes). The launcher, its daemons and munge stay outside every sandbox."""
    prefix = unshare_argv()
    if prefix is None:
        raise RuntimeError("unshare (util-linux) is not installed")
    ro = Path(job_dir) / "ro"
    init = ro / INIT.name
    shutil.copyfile(INIT, init)
    return [*prefix, sys.executable, "-I", "-S", str(init), f"@{ro / RANK_PLAN}", "--"]


def rank_plan(job_dir: Path, env: dict[str, str], hide: Iterable[Path],
              keep: Iterable[Path | str] | None = None,
              limits: Mapping[str, Any] | None = None) -> dict:
    """The plan of every rank's sandbox (`rank_wrap`), written in the job's `ro/`: `plan`'s
    view and env, and besides the variables the launcher's daemon set for the rank
    (`RANK_INHERIT`), its PMIx server's folder read-only (`RANK_BIND_ENV`), one /dev/shm
    folder of the job per node shared by the node's ranks (a folder of the host's /dev/shm
    named after the job, removed by the node's last sandbox to end) and Open MPI's single
    copy off (`no_single_copy`). Its limits are `plan`'s for each rank, with no pids
    cgroup: the controller's cgroup is not on the ranks' nodes, and slurmd tracks its tasks
    in its own (RLIMIT_NPROC, else sandbox_init's count, per rank)."""
    spec = plan(job_dir, ["/bin/false"], env, hide, keep, {**(limits or {}), "cgroup": None})
    spec["env"] = {**env, **no_single_copy(env, open_mpi_major(find_mpiexec() or "mpiexec"))}
    spec["inherit"] = dict(RANK_INHERIT)
    spec["bind_env"] = dict(RANK_BIND_ENV)
    spec["pid_env"] = list(RANK_PID_ENV)
    spec["shared_shm"] = (f"{SHM_ROOT}/{sandbox_init.SHM_PREFIX}{Path(job_dir).name}-"
                          f"{secrets.token_hex(6)}")
    (Path(job_dir) / "ro" / RANK_PLAN).write_text(json.dumps(spec))
    return spec


REMOTE_START = Path(__file__).with_name("remote_start.py")
#: how Open MPI's launchers take their remote-start agent and their no-tree-spawn switch:
#: Open MPI 4 (ORTE) as `--mca plm_rsh_*`, Open MPI 5 (PRRTE) as `--prtemca plm_ssh_*` (PRRTE
#: ignores `plm_rsh_agent`); each also from its environment
AGENT_PARAMS = {4: ("--mca", "plm_rsh_agent", "plm_rsh_no_tree_spawn", "OMPI_MCA_"),
                5: ("--prtemca", "plm_ssh_agent", "plm_ssh_no_tree_spawn", "PRTE_MCA_")}
MCA_FLAGS = ("--mca", "-mca", "--prtemca", "-prtemca", "--gmca", "-gmca")


@functools.lru_cache(maxsize=8)
def open_mpi_major(program: str) -> int | None:
    from .simhosts import open_mpi_major as major

    return major(program)


def remote_agent(argv: list[str], env: Mapping[str, str], major: int) -> tuple[list[str],
                                                                               list[str]]:
    """(the launcher's command without its remote-start agent, that agent's command): the
    one its options name (the last), else its environment's, else ssh."""
    names = {AGENT_PARAMS[major][1], "plm_rsh_agent", "plm_ssh_agent", "orte_rsh_agent",
             "pls_rsh_agent"}
    ours = {"plm", "plm_rsh_no_tree_spawn", "plm_ssh_no_tree_spawn",  # set again by the caller
            "orte_leave_session_attached"}
    kept, agent = [argv[0]], None
    i = 1
    while i < len(argv):
        if argv[i] in MCA_FLAGS and i + 2 < len(argv) and argv[i + 1] in names | ours:
            if argv[i + 1] in names:
                agent = argv[i + 2]
            i += 3
            continue
        kept.append(argv[i])
        i += 1
    if agent is None:
        agent = next((env[k] for k in (f"{AGENT_PARAMS[major][3]}{AGENT_PARAMS[major][1]}",
                                       "OMPI_MCA_plm_rsh_agent") if env.get(k)), "ssh")
    # Open MPI's own reading: words split at blanks; "ssh : rsh" tries each in turn
    agent = agent.split(":")[0].strip() or "ssh"
    return kept, agent.split()


def wrap_over_nodes(job_dir: Path, argv: list[str], env: dict[str, str], hide: Iterable[Path],
                    remote: Iterable[str], keep: Iterable[Path | str] | None = None,
                    limits: Mapping[str, Any] | None = None) -> list[str]:
    """The command that runs a job whose ranks span nodes in one sandbox per node: `argv`
    (Open MPI's mpirun) inside the sandbox of this node, its daemon on each node of `remote`
    inside a sandbox of that node, started outside by `remote_start.py`'s broker with the
    remote-start agent the launcher was given (see that file). Every node's sandbox has the
    same view (`plan`'s, from the same `hide` and `keep`) and limits of its own."""
    major = open_mpi_major(argv[0])
    if major not in AGENT_PARAMS:
        raise RuntimeError(f"the job's launcher {argv[0]} is not Open MPI 4's or 5's mpirun: "
                           "a job over nodes runs in its sandboxes only with Open MPI's")
    prefix = unshare_argv()
    if prefix is None:
        raise RuntimeError("unshare (util-linux) is not installed")
    remote = list(dict.fromkeys(remote))
    ro = Path(job_dir) / "ro"
    client = ro / REMOTE_START.name
    shutil.copyfile(REMOTE_START, client)
    words = [sys.executable, "-I", "-S", str(client), "start"]
    if any(not w or any(c.isspace() for c in w) for w in words):
        raise RuntimeError(f"the remote-start agent's command has a blank in a path: {words}")
    kept, agent = remote_agent(argv, env, major)
    flag, agent_param, tree_param, _ = AGENT_PARAMS[major]
    launch = [kept[0], flag, "plm", "rsh" if major == 4 else "ssh", flag, agent_param,
              " ".join(words), flag, tree_param, "1"]
    if major == 4:  # ORTE daemonizes its remote daemons: one must stay in its sandbox
        launch += ["--mca", "orte_leave_session_attached", "1"]
    launch += kept[1:]
    plans = {}
    for i, node in enumerate(remote):
        spec = plan(job_dir, ["/bin/false"], env, hide, keep, limits)
        spec["lifeline"] = "stdin"
        path = ro / f"sandbox-{i}.json"
        path.write_text(json.dumps(spec))
        plans[node] = str(path)
    config = {"socket": str(Path(job_dir).resolve() / "remote-start.sock"), "agent": agent,
              "nodes": remote, "plans": plans,
              "sandbox": [*prefix, sys.executable, "-I", "-S", str(INIT)]}
    (ro / REMOTE_CONFIG).write_text(json.dumps(config))
    local = wrap(job_dir, launch, env, hide, keep, limits)
    return [sys.executable, "-I", "-S", str(REMOTE_START), "serve", str(ro / REMOTE_CONFIG),
            "--", *local]


def ranks_up(proc: subprocess.Popen, argv: list[str]) -> None:
    """Every rank of the job `proc` runs (`argv`, its command): where it is a broker of
    remote starts (`wrap_over_nodes`), it closes its socket now, whatever node its launcher
    did not ask for (one the launcher took for its own)."""
    if argv[3:5] == [str(REMOTE_START), "serve"] and proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when sandboxes work on this machine, else the reason they do not."""
    if sys.platform != "linux":
        return f"job sandboxes need Linux namespaces (this is {sys.platform})"
    prefix = unshare_argv()
    if prefix is None:
        return "unshare (util-linux) is not installed"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="commbench-probe-") as tmp:
        job = Path(tmp).resolve() / "job"
        (job / "ro").mkdir(parents=True)
        hidden = Path(tmp).resolve() / "hidden"
        hidden.mkdir()
        (hidden / "secret").write_text("x")
        check = (f"import os,sys; assert not os.path.exists({str(hidden / 'secret')!r}); "
                 f"assert os.getcwd() == {str(job)!r}, os.getcwd(); "
                 f"open({str(job / 'w')!r}, 'w').write('ok'); "
                 "assert os.getpid() <= 3, os.getpid()")
        argv = wrap(job, [sys.executable, "-I", "-S", "-c", check], {"PATH": "/usr/bin:/bin"},
                    hide=[hidden])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the sandbox probe failed: {exc}"
        if done.returncode != 0 or not (job / "w").exists():
            why = (done.stderr or done.stdout).strip().splitlines()
            return ("user/mount/PID namespaces are not usable here: "
                    f"{why[-1] if why else f'exit code {done.returncode}'}")
    return None
