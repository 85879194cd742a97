"""An item's folder after its verdict: a passing item's removed, a failing one's cut down to
the evidence a person reads (see `tidy`)."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from ..rank import protocol
from ..tasks import LANGUAGES


def tidy(work: Path, everything: bool, seconds: float = 30.0) -> None:
    """Free the disk, in at most `seconds`: a passing item leaves nothing; a failing one
    keeps the evidence a human looks at and nothing else its solution wrote. Kept: the
    solution's source (`solution.<ext>`), and in each job's folder its output log (as the
    job left it, its first MiB and its tail; its last 2 MiB if it grew past that), its job
    file (`ro/job.json`) and its ranks' status, stack and guard files (and the MPS state)
    under `out/` (64 KiB each); removed: scratch folders, data, copies of the code and
    libraries, anything else. Nothing is followed: a link, FIFO or device is
    removed, never opened; a kept file is opened without following links and only if it is
    a regular file; folders are walked from descriptors, a few at a time (deeper ones are
    moved up first), so a deep or huge tree costs time, never more than `seconds`."""
    deadline = time.monotonic() + seconds
    folder_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    evidence = re.compile(protocol.EVIDENCE)
    # the source of any language a task may be written in (a HIP answer's .hip included)
    solution = re.compile(r"solution(" + "|".join(re.escape(x) for x in LANGUAGES.values())
                          + ")")

    def kind(dir_fd: int, name: str) -> int | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return None

    def opened(dir_fd: int, name: str) -> int | None:
        """A descriptor of the folder `name` (made readable if its solution closed it)."""
        for attempt in range(2):
            try:
                return os.open(name, folder_flags, dir_fd=dir_fd)
            except PermissionError:
                if attempt == 0:
                    try:
                        os.chmod(name, 0o700, dir_fd=dir_fd)
                    except OSError:
                        return None
            except OSError:
                return None
        return None

    def folder(dir_fd: int, name: str) -> bool:
        """Whether `name` is a folder; anything else there is removed (never opened)."""
        mode = kind(dir_fd, name)
        if mode is None:
            return False
        if not stat.S_ISDIR(mode):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
            return False
        return True

    def purge(dir_fd: int, name: str) -> None:
        """Remove `name` of the folder open at `dir_fd`, with everything under it."""
        if not folder(dir_fd, name):
            return
        top = opened(dir_fd, name)
        if top is None:
            return
        stack = [(top, name, os.listdir(top))]  # (descriptor, name in its parent, to do)
        moved = 0
        try:
            while stack:
                if time.monotonic() > deadline:
                    return
                fd, own, todo = stack[-1]
                if not todo:
                    # emptied (or what is left could not go): remove it from its parent
                    stack.pop()
                    os.close(fd)
                    try:
                        os.rmdir(own, dir_fd=stack[-1][0] if stack else dir_fd)
                    except OSError:
                        pass
                    continue
                entry = todo.pop()
                if not folder(fd, entry):
                    continue
                if len(stack) >= 16:  # few descriptors at once: a deep folder moves up
                    moved += 1
                    fresh = f".tidy-{moved}"
                    try:
                        os.rename(entry, fresh, src_dir_fd=fd, dst_dir_fd=top)
                        stack[0][2].append(fresh)
                    except OSError:
                        pass
                    continue
                sub = opened(fd, entry)
                if sub is not None:
                    try:
                        stack.append((sub, entry, os.listdir(sub)))
                    except OSError:
                        os.close(sub)
        finally:
            for fd, _own, _todo in stack:
                os.close(fd)

    def cap(dir_fd: int, name: str, limit: int) -> None:
        """Keep `name` if it is a regular file, cut to its last `limit` bytes; else remove."""
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError:
            purge(dir_fd, name)
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                fd = -1
                purge(dir_fd, name)
                return
            if info.st_size > limit:
                note = f"[... {info.st_size - limit} bytes cut when the item was tidied ...]\n"
                tail = os.pread(fd, limit, info.st_size - limit)
                os.ftruncate(fd, 0)
                os.pwrite(fd, note.encode() + tail, 0)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def keep_only(dir_fd: int, name: str, keep) -> None:
        """In the folder `name`: `keep(entry)` says the cap of a file kept, None: removed."""
        if kind(dir_fd, name) is None or not stat.S_ISDIR(kind(dir_fd, name)):
            purge(dir_fd, name)
            return
        fd = opened(dir_fd, name)
        if fd is None:
            return
        try:
            for entry in os.listdir(fd):
                if time.monotonic() > deadline:
                    return
                limit = keep(entry)
                if limit is None:
                    purge(fd, entry)
                elif isinstance(limit, int):
                    cap(fd, entry, limit)
                else:
                    keep_only(fd, entry, limit)
        except OSError:
            pass
        finally:
            os.close(fd)

    def in_out(entry: str) -> int | None:
        return 64 << 10 if evidence.fullmatch(entry) else None

    def in_ro(entry: str) -> int | None:
        return 1 << 20 if entry == "job.json" else None

    def in_job(entry: str):
        return {"output.log": 2 << 20, "out": in_out, "ro": in_ro}.get(entry)

    def in_work(entry: str):
        return 4 << 20 if solution.fullmatch(entry) else in_job

    try:
        parent = os.open(work.parent, folder_flags)
    except OSError:
        return
    try:
        if everything:
            purge(parent, work.name)
        else:
            keep_only(parent, work.name, in_work)
    finally:
        os.close(parent)
