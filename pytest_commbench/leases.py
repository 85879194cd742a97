"""Device leases: with pytest-xdist, items never share a GPU.

A lease is an exclusive `flock` on one lock file per device; the kernel drops it when the
holder exits, however it exits, so a crashed worker never leaves a device locked. A timed item
takes every device of the node (its numbers must not be disturbed by a neighbour) unless the
user opts out; an untimed one (a mutant) takes only the devices it needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.2


def lock_dir() -> Path:
    path = Path(os.environ.get("COMMBENCH_LOCK_DIR") or Path(tempfile.gettempdir()) / "commbench-locks")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _try(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def lease(count: int, total: int, exclusive: bool, folder: Path | None = None) -> Iterator[list[int]]:
    """Hold `count` of the node's `total` devices (all of them when exclusive); yields their
    indices. Blocks until they are free."""
    folder = folder or lock_dir()
    paths = [folder / f"device{i}.lock" for i in range(total)]
    want = total if exclusive else count
    if want > total:
        raise ValueError(f"needs {want} devices, the node has {total}")
    held: dict[int, int] = {}
    try:
        while True:
            if exclusive:  # in index order: two exclusive leases cannot deadlock
                for i, p in enumerate(paths):
                    while i not in held:
                        fd = _try(p)
                        if fd is None:
                            time.sleep(POLL_S)
                        else:
                            held[i] = fd
                break
            for i, p in enumerate(paths):
                if len(held) == want:
                    break
                fd = _try(p)
                if fd is not None:
                    held[i] = fd
            if len(held) == want:
                break
            for fd in held.values():  # not enough free: give back and wait
                os.close(fd)
            held.clear()
            time.sleep(POLL_S)
        yield sorted(held)[:count]
    finally:
        for fd in held.values():
            os.close(fd)
