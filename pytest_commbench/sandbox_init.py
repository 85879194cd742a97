"""The first process of a job's sandbox (PID 1 of its PID namespace); standard library only.

Started by `unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc`
with a JSON plan as its one argument, it is root of a user namespace of its own and owns a
mount namespace that nothing else shares. It builds the job's view of the filesystem, an
allow-list, then starts the launcher with no capabilities and waits:

- the job's root is a fresh, empty tmpfs; `pivot_root` makes it the root and the host's
  root is detached, so nothing of the host is reachable but what was bound into it;
- bound read-only at their own paths: what the plan keeps (the system trees /usr, /etc,
  /lib..., the Python environment, the MPI and CUDA trees); a symbolic link on the way to a
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

The launcher runs in the job's folder with an empty capability bounding set and
no_new_privs, so it and every rank can neither undo a mount nor gain a capability; mounts
inherited by any namespace they create are locked by the kernel. When the launcher ends,
this process ends, and the kernel kills every process left in the namespace (daemons
included). When the controller dies, `unshare --kill-child` (itself killed by the
parent-death signal the controller set) kills this process, with the same effect.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import signal
import stat
import sys

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
    RANK = {"job": 0, "tmpfs": 1, "bind": 2, "cover": 3}

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, int | None]] = {}  # path -> (kind, source fd)
        self.links: dict[str, str] = {}

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
            if kind in ("bind", "job"):
                mount(f"/proc/self/fd/{fd}", at, None, MS_BIND | MS_REC)
                if path == "/dev":
                    mask_block_devices(at, null_fd)
            elif kind == "tmpfs":
                mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, SCRATCH[path])
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


def build(plan: dict) -> str:
    """Build the job's view; returns the job's folder (its path with no link in it)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    view = View()
    for path in plan["keep"]:
        view.add(path, "bind")
    for path in HOST:
        if view.add(path, "bind") is None:
            raise SetupError(f"{path} is missing")
    for path in SCRATCH:
        view.fresh(path)
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
    writable = {*SCRATCH, job, "/proc"}
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


def main() -> int:
    plan = json.loads(sys.argv[1])
    try:
        job = build(plan)
    except (SetupError, OSError) as exc:
        # 125: the sandbox could not be built (the controller reads this as infra_error)
        sys.stderr.write(f"[commbench sandbox] set-up failed: {exc}\n")
        return 125
    pid = os.fork()
    if pid == 0:
        try:
            drop_privileges()
            os.chdir(job)
            os.execvpe(plan["argv"][0], plan["argv"], plan["env"])
        except BaseException as exc:  # noqa: BLE001 - report and leave
            sys.stderr.write(f"[commbench sandbox] could not start the launcher: {exc}\n")
        os._exit(125)
    # forward a termination request to the launcher; reap everything; leave with its status
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    status = 0
    while True:
        try:
            done, st = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if done == pid:
            status = os.waitstatus_to_exitcode(st)
            break
    # leaving ends the namespace: the kernel kills whatever the launcher left behind
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
