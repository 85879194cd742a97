"""The first process of a job's sandbox (PID 1 of its PID namespace); standard library only.

Started by `unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc`
with a JSON plan as its one argument, it is root of a user namespace of its own and owns a
mount namespace that nothing else shares. It builds the job's view of the filesystem, an
allow-list, then starts the launcher with no capabilities and waits:

- the job's root is a fresh, empty tmpfs; `pivot_root` makes it the root and the host's
  root is detached, so nothing of the host is reachable but what was bound into it;
- bound read-only at their own paths: what the plan keeps (the system trees /usr, /lib...,
  the files of /etc programs read, the Python environment, the MPI and CUDA trees); a
  symbolic link on the way to a
  kept path (/bin -> usr/bin, /usr/local/cuda -> cuda-12.8) is made again as a link;
- what the plan hides (the package, the references, every run's files, the build cache,
  the project tree) is covered by an empty read-only tmpfs where it lies inside a kept
  tree; what is kept inside a hidden tree (a virtual environment in the project) is visible;
- /dev is the host's (device nodes of the GPUs and NICs), read-only, with its block devices
  covered by /dev/null; /sys is the host's, read-only (NCCL and CUDA read the PCI topology);
- /tmp, /var/tmp, /dev/shm and /run are fresh tmpfs mounts of this job alone (Open MPI's and
  NCCL's shared-memory files die with the job);
- /proc is this PID namespace's own (no process outside the job is visible) and /proc/sys
  is read-only;
- the job's own folder is bound writable at its own path, except its `ro/` part (job file,
  solution, rank code), which stays read-only.

A rank started by a batch system's launcher (srun) runs in a sandbox of its own, from a plan
that says besides (`sandbox.rank_plan`):

- `inherit`: the variables the launcher's daemon set for this rank (they differ per rank),
  taken from this process's own environment: a mapping of a name, or a prefix ending in
  `*`, to who wins where the plan's env names the variable too: "launcher" (its value) or
  "plan" (the plan's; the launcher's only fills in). Nothing else of this process's
  environment reaches the job;
- `bind_env`: variables whose values (from this process's environment) name folders bound
  at their own path, each read-only ("ro") or writable ("rw", a mount of its own wherever
  it lies): the launcher's PMIx server's folder of the job step; a value that is not an
  absolute folder, or is the root, is left out, and one of the job's fresh mounts (/tmp)
  stays the job's;
- `pid_env`: variables of this process's environment, the first of which that holds a
  number is the launcher's PID in this sandbox (`ns_last_pid`; srun's SLURM_TASK_PID, the
  task's PID on the host, unique on the node): ranks of a node must have PIDs of their own,
  since Open MPI takes a shared-memory segment whose creator's PID is its own for one of
  its own and never maps it (every rank would be PID 2);
- `shared_shm`: a folder of the host's /dev/shm (made here where missing, mode 0700) bound
  writable as the job's /dev/shm instead of a fresh tmpfs: the ranks of one node, each in a
  sandbox of its own, share their shared memory through it. Every sandbox holds a shared
  lock on it; the last to end on the node removes it, and one that none holds and nothing
  touched for `SHM_STALE_S` (its job's sandboxes were killed) is removed by the next
  sandbox. Its size is measured every tick against `tmpfs_bytes` of /dev/shm (each rank's
  sandbox stops its rank above it).

The launcher runs in the job's folder with an empty capability bounding set and
no_new_privs, so it and every rank can neither undo a mount nor gain a capability; mounts
inherited by any namespace they create are locked by the kernel. When the launcher ends,
this process kills every process left in the namespace (daemons included) and leaves. When
the controller dies, `unshare --kill-child` (itself killed by the parent-death signal the
controller set) kills this process, and the kernel ends the namespace with it.

The job's limits (the plan's `limits`, see `sandbox.default_limits`):

- processes and threads, `pids_max` for the whole job, by the first of these that works:
  a pids cgroup of the job's own (`pids.max`; a child of a cgroup v2 the controller may
  write and whose `cgroup.subtree_control` has `pids` — a delegation —, else of the cgroup
  v1 `pids` hierarchy where the controller may write: root in most containers), created
  here before the view is built, the launcher moved into it before its exec, emptied and
  removed when the job ends (one left by a job killed from outside is removed by the
  controller's next job); a fork past the limit fails (EAGAIN). Else RLIMIT_NPROC, set
  for the launcher: from Linux 5.14 the kernel counts it per user namespace, so it counts
  the job's processes alone (not every process of the user), but it never applies to a job
  of the host's root (the kernel exempts root's own processes from RLIMIT_NPROC, in any
  namespace). Where neither holds (root without a writable pids cgroup, or a kernel before
  5.14), this process counts the namespace's tasks every `TICK_S` and stops the job above
  the limit: bounded, but after the fact (a fork bomb may get a tick's worth past it);
- the tmpfs mounts /tmp, /var/tmp, /dev/shm and /run are sized (`tmpfs_bytes`, with an
  inode limit in proportion): a job fills them to their size and no further;
- the job's folder, on the host's disk: no file may grow past `fsize_bytes` (RLIMIT_FSIZE:
  the write fails with EFBIG, Python's processes ignore SIGXFSZ), no core dump is written
  (RLIMIT_CORE 0), and this process measures the folder (every `WALK_S`, and at once when
  the disk's free space falls below `disk_reserve_bytes`) and stops the job once it wrote
  more than `scratch_bytes` there, or more than the disk had free above that reserve when
  the job began, or holds more than `scratch_files` entries. A stopped job ends with
  `LIMIT_EXIT` and one line on its output saying which limit and by how much: the
  solution's failure (the job had long loaded it), never the harness's.

What remains: memory is not limited (no memory cgroup; a job can take the host's RAM, the
tmpfs mounts included, until the kernel's OOM killer acts); the folder's quota is measured,
so a job may write up to a tick's worth of disk bandwidth past it before it is stopped; CPU
time is bounded by the job's deadline only; without the sandbox (`--commbench-unsandboxed`)
none of these limits applies.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import resource
import select
import shutil
import signal
import stat
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOSYMFOLLOW, MS_BIND, MS_REC, MS_PRIVATE = 32, 256, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
FLAG_OF = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
           "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
           "strictatime": MS_STRICTATIME, "nosymfollow": MS_NOSYMFOLLOW}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
                  "s390x": 217}
MAX_LINKS = 40
# the job's own scratch, empty and writable (and the host's /var/run -> /run made again)
SCRATCH = {"/tmp": "mode=1777", "/var/tmp": "mode=1777", "/dev/shm": "mode=1777",
           "/run": "mode=755"}
INODE_BYTES = 16384  # a sized tmpfs gets one inode per this many bytes (at least 1024)
SETUP_FAILED = 125  # the sandbox could not be built
LIMIT_EXIT = 122  # the job went past one of its limits and was stopped
TICK_S = 0.2  # how often the job's limits are looked at
WALK_S = 1.0  # how often the job's folder is measured, at least (more when it is large)
MIN_BUDGET = 16 << 20  # a job may always write this much into its folder
NPROC_PER_NAMESPACE = (5, 14)  # the kernel that counts RLIMIT_NPROC per user namespace
# what the host lends as it is: its devices, its sysfs, and the PID namespace's /proc that
# `unshare --mount-proc` mounted
HOST = ("/dev", "/sys", "/proc")
# a mount under these that cannot be made read-only (one a container runtime locked) is
# left as it is; anywhere else that ends the set-up
PSEUDO = ("/dev", "/sys", "/proc")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long


class SetupError(Exception):
    pass


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"mount {source} on {target} ({fstype}, flags {flags:#x}): "
                         f"{os.strerror(err)}")


OCTAL = re.compile(rb"\\([0-7]{3})")


def unescape(field: bytes) -> str:
    """A path as mountinfo writes it: space, tab, newline and backslash as octal `\\ooo`,
    every other byte as it is (UTF-8 names included)."""
    return os.fsdecode(OCTAL.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field))


def mount_points() -> list[tuple[str, int]]:
    """(mount point, per-mount flags) of every mount, parents before children."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.rstrip(b"\n").split(b" ")
            flags = 0
            for opt in fields[5].split(b","):
                flags |= FLAG_OF.get(opt.decode("ascii", "replace"), 0)
            points.append((unescape(fields[4]), flags))
    return points


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def walk(path: str) -> tuple[list[tuple[str, str]], str]:
    """The symbolic links met on the way to `path`, each as (where it is, what it says), and
    the path it leads to with no link left in it."""
    links: list[tuple[str, str]] = []
    todo = [p for p in path.split("/") if p]
    cur = "/"
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            if len(links) >= MAX_LINKS:
                raise SetupError(f"{path}: {os.strerror(errno.ELOOP)}")
            target = os.readlink(nxt)
            links.append((nxt, target))
            if target.startswith("/"):
                cur = "/"
            todo = [p for p in target.split("/") if p] + todo
            continue
        cur = nxt
    return links, cur


class View:
    """The job's view, planned on the host's filesystem before anything is mounted: what is
    bound (from descriptors opened now), covered, made fresh, and which links are made."""

    # on one path: the job's folder over a fresh tmpfs over a kept tree over a hidden one
    RANK = {"job": 0, "tmpfs": 1, "shared": 1, "bind": 2, "cover": 3}

    def __init__(self, scratch: dict[str, str] | None = None) -> None:
        self.entries: dict[str, tuple[str, int | None]] = {}  # path -> (kind, source fd)
        self.links: dict[str, str] = {}
        self.scratch = scratch or SCRATCH  # mount options of the fresh tmpfs mounts

    def add(self, path: str, kind: str) -> str | None:
        """Plan `path` (links on the way made again); its link-free path, None if absent."""
        links, real = walk(path)
        if not os.path.lexists(real):
            return None
        if kind in ("bind", "job"):
            self.links.update(links)
        old = self.entries.get(real)
        if old is not None and self.RANK[old[0]] <= self.RANK[kind]:
            return real
        if old is not None and old[1] is not None:
            os.close(old[1])
        fd = None
        if kind in ("bind", "job"):
            fd = os.open(real, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.entries[real] = (kind, fd)
        return real

    def fresh(self, path: str) -> None:
        """Plan a fresh tmpfs on `path` (made where the host has none)."""
        old = self.entries.get(path)
        if old is not None and old[1] is not None:
            os.close(old[1])
        self.entries[path] = ("tmpfs", None)

    def share(self, path: str, fd: int) -> None:
        """Plan the folder open as `fd` bound writable on `path` (a scratch mount's place:
        the node's shared /dev/shm)."""
        old = self.entries.get(path)
        if old is not None and old[1] is not None:
            os.close(old[1])
        self.entries[path] = ("shared", fd)

    def nearest(self, path: str) -> str | None:
        """The kind of the innermost entry strictly above `path` (None: the fresh root)."""
        best, kind = "", None
        for p, (k, _fd) in self.entries.items():
            if p != path and inside(path, p) and len(p) > len(best):
                best, kind = p, k
        return kind

    def build(self, root: str, null_fd: int) -> None:
        """Mount it all under `root` (the fresh tmpfs), outer paths first. Nothing is ever
        created inside a bound tree: a path there exists already, or is left out."""
        steps = [(p, k, fd) for p, (k, fd) in self.entries.items()]
        steps += [(p, "link", None) for p in self.links]
        steps.sort(key=lambda s: (s[0].count("/") if s[0] != "/" else 0, s[1] == "link", s[0]))
        for path, kind, fd in steps:
            above = self.nearest(path)
            host = above in ("bind", "job")  # `path` lies in a tree of the host's
            at = root + path
            if kind == "link":
                if not host and not os.path.lexists(at):
                    os.makedirs(os.path.dirname(at), exist_ok=True)
                    os.symlink(self.links[path], at)
                continue
            if kind == "bind" and host and path not in HOST:
                continue  # visible already, as it is on the host
            if kind == "cover" and not host:
                continue  # nothing to hide: it is not in the view
            if host:
                if not os.path.lexists(at):
                    continue
            elif fd is not None and not stat.S_ISDIR(os.fstat(fd).st_mode):
                os.makedirs(os.path.dirname(at), exist_ok=True)
                if not os.path.lexists(at):
                    os.close(os.open(at, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            else:
                os.makedirs(at, exist_ok=True)
            if kind == "shared":
                mount(f"/proc/self/fd/{fd}", at, None, MS_BIND)
            elif kind in ("bind", "job"):
                mount(f"/proc/self/fd/{fd}", at, None, MS_BIND | MS_REC)
                if path == "/dev":
                    mask_block_devices(at, null_fd)
            elif kind == "tmpfs":
                mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, self.scratch[path])
            elif os.path.isdir(at):  # a hidden tree
                mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
            else:  # a hidden file
                mount(f"/proc/self/fd/{null_fd}", at, None, MS_BIND)

    def close(self) -> None:
        for _kind, fd in self.entries.values():
            if fd is not None:
                os.close(fd)


def mask_block_devices(dev: str, null_fd: int) -> None:
    """Cover every block device node under `dev` with /dev/null: a disk read raw would show
    every file of its filesystems, the hidden ones included."""
    for folder, dirs, files in os.walk(dev):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(folder, d))]
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISBLK(st.st_mode):
                mount(f"/proc/self/fd/{null_fd}", path, None, MS_BIND)


def pivot(root: str) -> None:
    """Make `root` the root of this mount namespace and detach the host's (chroot where
    pivot_root is refused: the host's mounts are then out of reach, not gone)."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        if libc.umount2(b".", MNT_DETACH) != 0:
            raise SetupError(f"detaching the host's root: {os.strerror(ctypes.get_errno())}")
    else:
        os.chroot(".")
    os.chdir("/")


def scratch_options(limits: dict) -> dict[str, str]:
    """The mount options of the fresh tmpfs mounts, with their sizes from the plan."""
    sizes = limits.get("tmpfs_bytes") or {}
    options = {}
    for path, base in SCRATCH.items():
        size = sizes.get(path) if isinstance(sizes, dict) else sizes
        if size:
            size = max(int(size), 4096)
            base += f",size={size},nr_inodes={max(1024, size // INODE_BYTES)}"
        options[path] = base
    return options


def matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def job_env(plan: dict, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment: the plan's `env`, with what its `inherit` takes from
    this process's environment (the variables a batch system's daemon set for this rank)."""
    environ = os.environ if environ is None else environ
    env = dict(plan["env"])
    rules = plan.get("inherit") or {}
    for name, value in environ.items():
        wins = [w for p, w in rules.items() if matches(name, p)]
        if not wins:
            continue
        if name not in env or "launcher" in wins:
            env[name] = value
    return env


def env_binds(plan: dict, environ: dict[str, str] | None = None) -> list[tuple[str, bool]]:
    """(folder, writable) of each folder the plan's `bind_env` names through this process's
    environment (a mapping of a variable's name to "ro" or "rw"), in order, each once (the
    first mention's mode)."""
    environ = os.environ if environ is None else environ
    found: dict[str, bool] = {}
    for name, mode in (plan.get("bind_env") or {}).items():
        value = environ.get(name, "")
        if not value.startswith("/"):
            continue
        path = os.path.normpath(value)
        if path == "/" or os.path.realpath(path) == "/" or not os.path.isdir(path):
            continue
        found.setdefault(path, mode == "rw")
    return list(found.items())


def launcher_pid(plan: dict, environ: dict[str, str] | None = None) -> int | None:
    """The PID the plan's `pid_env` asks for the launcher, if any (at least 2: this process
    is 1)."""
    environ = os.environ if environ is None else environ
    for name in plan.get("pid_env") or ():
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 2:
            return int(value)
    return None


def last_pid_file(plan: dict) -> int | None:
    """/proc/sys/kernel/ns_last_pid of this PID namespace, open for writing before the view
    makes /proc/sys read-only, where the plan asks for the launcher's PID."""
    if launcher_pid(plan) is None:
        return None
    return os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)


SHM_PREFIX = "commbench-shm-"  # the shared /dev/shm folders' names begin so
SHM_STALE_S = 60.0  # an unheld folder untouched this long is a dead job's


def sweep_shm(parent: int, keep: str, now: float | None = None) -> None:
    """Remove the shared /dev/shm folders (in the folder open as `parent`) that no sandbox
    holds and that nothing touched for SHM_STALE_S: those of jobs whose every sandbox on this
    node was killed (SIGKILL leaves no time to remove one); only this user's."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(SHM_PREFIX) or name == keep:
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or now - st.st_mtime < SHM_STALE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a sandbox of its job still runs
            shutil.rmtree(name, dir_fd=parent, ignore_errors=True)
        finally:
            os.close(fd)


class SharedShm:
    """The node's shared /dev/shm folder of the job (the plan's `shared_shm`): made where
    missing, held with a shared lock while this sandbox lives, removed by the last sandbox
    of the node to end (the one that gets the lock alone); a dead job's, by the next."""

    def __init__(self, path: str) -> None:
        parent, self.name = os.path.split(os.path.normpath(path))
        if not self.name.startswith(SHM_PREFIX) or not parent.startswith("/"):
            raise SetupError(f"shared /dev/shm folder {path!r}")
        self.parent = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        sweep_shm(self.parent, self.name)
        try:
            try:
                os.mkdir(self.name, 0o700, dir_fd=self.parent)
            except FileExistsError:
                pass
            self.fd = os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC, dir_fd=self.parent)
        except OSError:
            os.close(self.parent)
            raise
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held alone by another sandbox's last look: this one removes nothing

    def remove(self) -> None:
        """Remove the folder if no other sandbox holds it (every process of this one is
        gone by then)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # another sandbox of the node still runs: the last one removes it
        else:
            shutil.rmtree(self.name, dir_fd=self.parent, ignore_errors=True)
        os.close(self.fd)
        os.close(self.parent)


def build(plan: dict, shm: SharedShm | None = None) -> str:
    """Build the job's view; returns the job's folder (its path with no link in it)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    view = View(scratch_options(plan.get("limits") or {}))
    for path in plan["keep"]:
        view.add(path, "bind")
    for path in HOST:
        if view.add(path, "bind") is None:
            raise SetupError(f"{path} is missing")
    binds = env_binds(plan)
    for path, rw in binds:
        if not rw:
            view.add(path, "bind")
    for path in SCRATCH:
        view.fresh(path)
    shared = []  # mounted of their own wherever they lie, and left writable (below)
    for path, rw in binds:
        links, real = walk(path)
        if rw and real not in SCRATCH:
            view.links.update(links)
            view.share(real, os.open(real, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC))
            shared.append(real)
    if shm is not None:
        view.share("/dev/shm", os.dup(shm.fd))
    for path in plan["hide"]:
        view.add(path, "cover")
    if os.path.islink("/var/run"):
        view.links["/var/run"] = os.readlink("/var/run")
    job = view.add(plan["job"], "job")
    if job is None:
        raise SetupError(f"the job's folder {plan['job']} is missing")
    null_fd = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
    # the host's paths are all known by now: the new root may cover any of them (/tmp)
    stage = "/tmp" if os.path.isdir("/tmp") else "/mnt"
    mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    view.build(stage, null_fd)
    view.close()
    os.close(null_fd)
    pivot(stage)
    writable = {*SCRATCH, job, "/proc", *shared}
    # every mount read-only but the writable ones; a remount keeps the flags the kernel locked
    for point, flags in mount_points():
        if point in writable or inside(point, "/proc") and point != "/proc/sys":
            continue
        if not os.path.lexists(point):
            continue
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except SetupError:
            if not any(inside(point, p) and point != p for p in PSEUDO):
                raise
    ro = os.path.join(job, "ro")
    mount(ro, ro, None, MS_BIND)
    mount(None, ro, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if os.path.isdir("/proc/sys"):
        mount("/proc/sys", "/proc/sys", None, MS_BIND)
        mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
              | MS_NOEXEC)
    return job


def drop_privileges() -> None:
    """No capability survives the exec that follows, and none can be gained later."""
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError("prctl(NO_NEW_PRIVS) failed")


# -- limits ------------------------------------------------------------------------------------

def kernel_at_least(version: tuple[int, int]) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return bool(found) and (int(found.group(1)), int(found.group(2))) >= version


def host_uid() -> int | None:
    """The host's uid of this namespace's root (from the user namespace's uid map)."""
    try:
        with open("/proc/self/uid_map", "rb") as f:
            for line in f:
                inside_id, outside, _count = (int(x) for x in line.split())
                if inside_id == os.getuid():
                    return outside
    except (OSError, ValueError):
        pass
    return None


class PidsCgroup:
    """A pids cgroup of the job's own, made in the plan's `parent` (a cgroup v2 that
    delegates `pids`, or a cgroup of the v1 `pids` hierarchy): created before the view is
    built (the host's /sys is read-only in it; everything here goes through descriptors
    opened now), the launcher moved into it, emptied and removed at the end."""

    def __init__(self, spec: dict, pids_max: int) -> None:
        parent, self.name = str(spec["parent"]), str(spec["name"])
        if "/" in self.name or self.name in ("", ".", ".."):
            raise SetupError(f"cgroup name {self.name!r}")
        self.parent = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.procs = -1
        try:
            os.mkdir(self.name, 0o755, dir_fd=self.parent)
        except OSError:
            os.close(self.parent)
            raise
        try:
            limit = os.open(f"{self.name}/pids.max", os.O_WRONLY | os.O_CLOEXEC,
                            dir_fd=self.parent)
            try:
                os.write(limit, str(int(pids_max)).encode())
            finally:
                os.close(limit)
            self.procs = os.open(f"{self.name}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC,
                                 dir_fd=self.parent)
        except OSError:
            self.remove()
            raise

    def add(self, pid: int) -> None:
        """Move process `pid` (of this PID namespace: the launcher-to-be, before its exec)
        into the cgroup."""
        os.write(self.procs, str(pid).encode())

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the cgroup once it is empty (every process of the job is gone by then)."""
        if self.procs >= 0:
            os.close(self.procs)
            self.procs = -1
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.name, dir_fd=self.parent)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # left for the controller's sweep of dead jobs' cgroups
                time.sleep(0.05)
        os.close(self.parent)


def make_cgroup(limits: dict) -> PidsCgroup | None:
    spec = limits.get("cgroup")
    if not spec or not limits.get("pids_max"):
        return None
    try:
        return PidsCgroup(spec, int(limits["pids_max"]))
    except (OSError, SetupError, KeyError, TypeError, ValueError):
        return None  # no cgroup after all: RLIMIT_NPROC or the count below


def set_rlimits(limits: dict, nproc: bool) -> None:
    """In the launcher-to-be, before its exec (inherited by every process of the job)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = limits.get("fsize_bytes")
    if fsize:
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(fsize), int(fsize)))
    data = limits.get("data_bytes")  # each process's heap and private mappings (a compiler's)
    if data:
        resource.setrlimit(resource.RLIMIT_DATA, (int(data), int(data)))
    if nproc and limits.get("pids_max"):
        count = int(limits["pids_max"])
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))


def usage(folder: str, stop_bytes: int | None = None, stop_files: int | None = None
          ) -> tuple[int, int]:
    """(bytes of disk, entries) under `folder`, links not followed, a file with several
    names counted once; the walk stops early once past `stop_bytes` or `stop_files`."""
    used = files = 0
    seen: set[tuple[int, int]] = set()
    todo = [folder]
    while todo:
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                files += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    todo.append(entry.path)
                if (stop_bytes is not None and used > stop_bytes) or \
                        (stop_files is not None and files > stop_files):
                    return used, files
    return used, files


def tasks_in_namespace() -> int:
    """Processes and threads of this PID namespace (its /proc)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            count += int(data[data.rfind(b")") + 2:].split()[17])
        except (OSError, ValueError, IndexError):
            continue
    return count


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Watch:
    """The limits the kernel does not hold for the job: its folder's size, the disk's free
    space, and (where no cgroup or RLIMIT_NPROC counts them) its processes."""

    def __init__(self, limits: dict, folder: str, count_tasks: bool,
                 shared_shm: str | None = None) -> None:
        self.folder = folder
        self.pids = int(limits.get("pids_max") or 0) if count_tasks else 0
        # a /dev/shm shared by the node's ranks (no tmpfs of this job's own to hold its size)
        sizes = limits.get("tmpfs_bytes") or {}
        size = sizes.get("/dev/shm") if isinstance(sizes, dict) else sizes
        self.shm, self.shm_bytes = (shared_shm, int(size)) if shared_shm and size else (None, 0)
        self.files = int(limits.get("scratch_files") or 0) or None
        self.reserve = int(limits.get("disk_reserve_bytes") or 0)
        quota = int(limits.get("scratch_bytes") or 0) or None
        self.start_used, _ = usage(folder)
        self.start_free = self.free()
        budget = quota
        if self.reserve and self.start_free is not None:
            room = max(MIN_BUDGET, self.start_free - self.reserve)
            budget = room if budget is None else min(budget, room)
        self.quota, self.budget = quota, budget
        self.next_walk = time.monotonic() + WALK_S

    def free(self) -> int | None:
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def check(self) -> str | None:
        """Why the job must stop now, or None."""
        if self.pids:
            count = tasks_in_namespace()
            if count > self.pids:
                return (f"the job ran {count} processes and threads at once, more than its "
                        f"limit of {self.pids}")
        if self.shm:
            used, _ = usage(self.shm, self.shm_bytes)
            if used > self.shm_bytes:
                return (f"the job's ranks on this node hold {_size(used)} in /dev/shm, more "
                        f"than its limit of {_size(self.shm_bytes)}")
        if self.budget is None and self.files is None:
            return None
        now = time.monotonic()
        free = self.free()
        low = free is not None and self.reserve and free < self.reserve
        if not low and now < self.next_walk:
            return None
        began = time.monotonic()
        stop = None if self.budget is None else self.start_used + self.budget
        used, files = usage(self.folder, stop, self.files)
        took = time.monotonic() - began
        self.next_walk = time.monotonic() + max(WALK_S, 10 * took)
        wrote = used - self.start_used
        if self.budget is not None and wrote > self.budget:
            if self.quota is not None and self.budget >= self.quota:
                why = f"its quota of {_size(self.quota)}"
            else:
                why = (f"what the disk had free above the {_size(self.reserve)} kept free "
                       f"when the job began ({_size(self.budget)})")
            return f"the job wrote {_size(wrote)} into its folder, more than {why}"
        if self.files is not None and files > self.files:
            return (f"the job made more than {self.files} files and folders in its folder, "
                    "its limit")
        return None


def cut(fd: int) -> bool:
    """Whether the lifeline `fd` is closed at its other end (what is written on it is
    read and ignored)."""
    try:
        ready, _, _ = select.select([fd], [], [], 0)
        return bool(ready) and not os.read(fd, 4096)
    except OSError:
        return True


def kill_all() -> None:
    """End every other process of this PID namespace and reap them all."""
    try:
        os.kill(-1, signal.SIGKILL)  # in a PID namespace: all of it but this process
    except OSError:
        pass
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return
        except InterruptedError:
            continue


PLAN_BYTES = 1 << 20  # a plan read from a file is at most this large


def read_plan(args: list[str]) -> dict:
    """The plan from this program's arguments: `PLAN` (the JSON itself) or `@FILE` (a file
    holding it: a node's plan in the job's read-only folder, which the sandboxed part of the
    job cannot change), then optionally `-- ARGV...`, the launcher to run instead of the
    plan's (the daemon a launcher's remote start asked for on this node)."""
    if not args:
        raise SetupError("no plan given")
    text = args[0]
    if text.startswith("@"):
        fd = os.open(text[1:], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SetupError(f"the plan {text[1:]} is not a file")
            data = os.read(fd, PLAN_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > PLAN_BYTES:
            raise SetupError(f"the plan {text[1:]} is too large")
        text = data.decode()
    plan = json.loads(text)
    if len(args) > 1:
        if args[1] != "--" or len(args) < 3:
            raise SetupError("usage: sandbox_init.py PLAN|@FILE [-- ARGV...]")
        plan["argv"] = args[2:]
    return plan


def main() -> int:
    try:
        plan = read_plan(sys.argv[1:])
    except (SetupError, OSError, ValueError) as exc:
        sys.stderr.write(f"[commbench sandbox] set-up failed: {exc}\n")
        return SETUP_FAILED
    limits = plan.get("limits") or {}
    try:
        shm = SharedShm(plan["shared_shm"]) if plan.get("shared_shm") else None
    except (SetupError, OSError) as exc:
        sys.stderr.write(f"[commbench sandbox] set-up failed: the shared /dev/shm: {exc}\n")
        return SETUP_FAILED
    group = make_cgroup(limits)
    try:
        return run(plan, limits, group, shm)
    finally:
        if group is not None:
            group.remove()
        if shm is not None:
            shm.remove()


def run(plan: dict, limits: dict, group: PidsCgroup | None,
        shm: SharedShm | None = None) -> int:
    try:
        env = job_env(plan)
        last_pid = last_pid_file(plan)
        job = build(plan, shm)
    except (SetupError, OSError) as exc:
        # the sandbox could not be built (the controller reads this as infra_error)
        sys.stderr.write(f"[commbench sandbox] set-up failed: {exc}\n")
        return SETUP_FAILED
    uid = host_uid()
    # RLIMIT_NPROC counts the job alone where the kernel counts it per user namespace, and
    # binds nobody when the host's uid is root's
    nproc = kernel_at_least(NPROC_PER_NAMESPACE)
    # a sandbox started on another node by the launcher's remote start lives while its
    # standard input is open (the broker's end on the launcher's node, as ssh's session)
    lifeline = plan.get("lifeline") == "stdin"
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    go_r, go_w = os.pipe()
    if last_pid is not None:  # the next PID of this namespace is the launcher's
        try:
            os.write(last_pid, str(launcher_pid(plan) - 1).encode())
        except OSError as exc:
            sys.stderr.write(f"[commbench sandbox] set-up failed: the launcher's PID: {exc}\n")
            return SETUP_FAILED
        finally:
            os.close(last_pid)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(go_w)
            # until this process is in the job's cgroup (or will not be)
            if os.read(go_r, 1) != b"x":
                os._exit(SETUP_FAILED)  # the sandbox's first process could not go on
            os.close(go_r)
            set_rlimits(limits, nproc)
            drop_privileges()
            os.chdir(job)
            # a session of the job's own: no process of the job shares a process group with
            # `unshare` outside (kill(0, ...) from the launcher's group would reach it), so
            # `unshare` dying of a signal the controller did not send is evidence from outside
            os.setsid()
            if lifeline:  # the job's standard input is not the lifeline's
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.execvpe(plan["argv"][0], plan["argv"], env)
        except BaseException as exc:  # noqa: BLE001 - report and leave
            sys.stderr.write(f"[commbench sandbox] could not start the launcher: {exc}\n")
        os._exit(SETUP_FAILED)
    os.close(go_r)
    joined = False
    if group is not None:
        try:
            group.add(pid)
            joined = True
        except OSError:
            pass  # no cgroup after all: RLIMIT_NPROC, or the count below
    try:
        watch = Watch(limits, job, count_tasks=not (joined or (nproc and uid not in (0, None))),
                      shared_shm="/dev/shm" if shm is not None else None)
        os.write(go_w, b"x")
    except OSError as exc:
        sys.stderr.write(f"[commbench sandbox] set-up failed: {exc}\n")
        os.close(go_w)
        kill_all()
        return SETUP_FAILED
    os.close(go_w)
    # forward a termination request to the launcher; reap everything; watch the limits;
    # leave with the launcher's status
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    status = None
    while status is None:
        while True:
            try:
                done, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                done, st = pid, 0
            if done == 0:
                break
            if done == pid:
                status = os.waitstatus_to_exitcode(st)
                break
        if status is not None:
            break
        if lifeline and cut(0):
            sys.stderr.write("[commbench sandbox] the job's launcher is gone: the sandbox "
                             "ends\n")
            sys.stderr.flush()
            kill_all()
            return 128 + signal.SIGKILL
        why = watch.check()
        if why:
            sys.stderr.write(f"\n[commbench sandbox] stopped the job: {why}\n")
            sys.stderr.flush()
            kill_all()
            return LIMIT_EXIT
        signal.sigtimedwait([signal.SIGCHLD], TICK_S)
    # nothing of the job outlives its launcher (the kernel would end it all too, but the
    # job's cgroup can only be removed once it is empty)
    kill_all()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
