"""Reading a file a job wrote, from the controller's side, without trusting the job's folder.

Everything under a job's folder is the solution's to make: a name the controller reads (a
rank's status, stack or guard report, the output log) may be a symbolic link (to the hidden
reference, to another item's files), a FIFO (whose open waits for a writer that never comes),
a socket, a folder or a file of gigabytes. So the controller reads such a file only here:

- the folder it starts from is the controller's own (a path it made, above the job's reach);
  every name below it is one the controller chose, opened one component at a time from the
  folder's descriptor without following links (`O_NOFOLLOW`), so neither the file nor a
  folder on the way (`out/`) can be a link;
- the file is opened with `O_NONBLOCK` (a FIFO's open returns at once) and read only if
  `fstat` of the opened descriptor says it is a regular file;
- at most `cap` bytes are read (the head, or the tail of a log).

A name that cannot be read that way is treated as absent (None): what a job wrote is only
ever quoted as evidence for a human, so a file that is not there says nothing either way.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CAP = 64 * 1024  # bytes read of a job's file unless the caller says otherwise
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _parts(name: str) -> list[str]:
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a name below a job's folder: {name!r}")
    return parts


def open_file(folder: Path | str, name: str) -> int | None:
    """A read-only descriptor of the regular file `name` ("out/status_r0.json": components
    separated by "/") below the controller's own `folder`, or None where there is none: a
    component that is a link, a FIFO, a socket, a device or a folder, or anything missing.
    The caller closes the descriptor."""
    parts = _parts(name)
    try:
        at = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            below = os.open(part, FOLDER_FLAGS, dir_fd=at)
            os.close(at)
            at = below
        fd = os.open(parts[-1], FILE_FLAGS, dir_fd=at)
    except OSError:
        return None
    finally:
        os.close(at)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def reopen(fd: int) -> int | None:
    """A fresh read-only descriptor of the regular file the controller's own descriptor `fd`
    is open on (a log it opened for writing): the same file whatever the job did to its name
    since (replaced it with a link or a FIFO, removed it). None where it is not a regular file
    or cannot be opened again. The caller closes it."""
    try:
        fresh = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fresh).st_mode):
            return fresh
    except OSError:
        pass
    os.close(fresh)
    return None


def read_fd(fd: int, cap: int = CAP, tail: bool = False) -> tuple[bytes, int]:
    """At most `cap` bytes of the open regular file `fd` (its first, or with `tail` its last)
    and the file's size then. Reads by offset: the descriptor's own position is not used."""
    size = os.fstat(fd).st_size
    start = max(0, size - cap) if tail else 0
    chunks, want = [], min(cap, max(size - start, 0))
    while want > 0:
        data = os.pread(fd, want, start)
        if not data:
            break
        chunks.append(data)
        start += len(data)
        want -= len(data)
    return b"".join(chunks), size


def read(folder: Path | str, name: str, cap: int = CAP, tail: bool = False) -> bytes | None:
    """At most `cap` bytes of the regular file `name` below the controller's own `folder`
    (see `open_file`), its first or with `tail` its last; None where there is no such file."""
    fd = open_file(folder, name)
    if fd is None:
        return None
    try:
        return read_fd(fd, cap, tail)[0]
    except OSError:
        return None
    finally:
        os.close(fd)


__all__ = ["CAP", "open_file", "read", "read_fd", "reopen"]
