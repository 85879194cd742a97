"""The first process of a job's sandbox (PID 1 of its PID namespace); standard library only.

Started by `unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc`
with a JSON plan as its one argument, it is root of a user namespace of its own and owns a
mount namespace that nothing else shares. It builds the job's view of the filesystem, then
starts the launcher with no capabilities and waits:

- every mount becomes read-only (flags the kernel locked are kept as they were);
- what the plan hides (the package, the references, every run's files, the build cache,
  the project tree) is covered by an empty read-only tmpfs; what it keeps inside a hidden
  tree (the Python environment) is bound back read-only;
- the job's own folder is bound back writable, except its `ro/` part (job file, solution,
  rank code), which stays read-only;
- /tmp, /var/tmp and /dev/shm are fresh tmpfs mounts of this job alone (Open MPI's and
  NCCL's shared-memory files die with the job);
- /proc is this PID namespace's own (no process outside the job is visible) and /proc/sys
  is read-only.

The launcher runs with an empty capability bounding set and no_new_privs, so it and every
rank can neither undo a mount nor gain a capability; mounts inherited by any namespace they
create are locked by the kernel. When the launcher ends, this process ends, and the kernel
kills every process left in the namespace (daemons included). When the controller dies,
`unshare --kill-child` (itself killed by the parent-death signal the controller set) kills
this process, with the same effect.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
FLAG_OF = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
           "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
           "strictatime": MS_STRICTATIME}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]


class SetupError(Exception):
    pass


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"mount {source} on {target} ({fstype}, flags {flags:#x}): "
                         f"{os.strerror(err)}")


def mount_points() -> list[tuple[str, int]]:
    """(mount point, per-mount flags) of every mount, parents before children."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            flags = 0
            for opt in fields[5].split(","):
                flags |= FLAG_OF.get(opt, 0)
            points.append((point, flags))
    return points


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def cover(path: str) -> None:
    """An empty tmpfs over `path` (made read-only with the rest, later)."""
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")


def bind_back(fd: int, path: str) -> None:
    """Bind the directory open as `fd` (opened before anything was covered) onto `path`."""
    os.makedirs(path, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)


def build(plan: dict) -> None:
    job = plan["job"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [p for p in plan["keep"] if os.path.isdir(p)] + [job]
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in keep}
    hidden = sorted({p for p in plan["hide"] if os.path.isdir(p)}, key=len)
    scratch = [t for t in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(t)]
    # the job's own /tmp and /dev/shm first (a job folder may lie in the host's), then hide
    # the outermost trees, bring back what is kept, then hide what lies inside kept trees
    # (a package installed inside the kept Python environment)
    for tmp in scratch:
        mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    outer = [h for h in hidden if not any(inside(h, k) and h != k for k in keep)]
    for h in outer:
        if not any(inside(h, o) and h != o for o in outer) and os.path.isdir(h):
            cover(h)  # (one under the job's fresh /tmp is gone already)
    for k in sorted(keep, key=len):
        if any(inside(k, h) for h in outer + scratch):
            bind_back(fds[k], k)
    for h in hidden:
        if h not in outer and os.path.isdir(h):
            cover(h)
    for fd in fds.values():
        os.close(fd)
    writable = {"/tmp", "/var/tmp", "/dev/shm", job, "/proc"}
    # every mount read-only, but the writable ones; a remount keeps the flags the kernel locked
    for point, flags in mount_points():
        if point in writable or inside(point, "/proc") and point != "/proc/sys":
            continue
        if not os.path.exists(point):
            continue
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except SetupError:
            if point in ("/", "/dev") or any(inside(point, h) for h in hidden):
                raise
            # a mount we cannot remount (e.g. one the container runtime locked) stays as it
            # is only when it lies outside anything the job must not write
    ro = os.path.join(job, "ro")
    mount(ro, ro, None, MS_BIND)
    mount(None, ro, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if os.path.isdir("/proc/sys"):
        mount("/proc/sys", "/proc/sys", None, MS_BIND)
        mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
              | MS_NOEXEC)


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
        build(plan)
    except (SetupError, OSError) as exc:
        # 125: the sandbox could not be built (the controller reads this as infra_error)
        sys.stderr.write(f"[commbench sandbox] set-up failed: {exc}\n")
        return 125
    pid = os.fork()
    if pid == 0:
        try:
            drop_privileges()
            os.chdir(plan["job"])
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
