"""Device leases: with pytest-xdist, items never share a GPU.

A lease is an exclusive `flock` on one lock file per device; the kernel drops it when the
holder exits, however it exits, so a crashed worker never leaves a device locked. A timed item
takes every device of the node (its numbers must not be disturbed by a neighbour) unless the
user opts out; an untimed one (a mutant) takes only the devices it needs.

A device may have several slots (`--commbench-jobs-per-gpu`, shared placement only): then up
to that many untimed jobs, each with its own MPS daemon, run on it side by side, one slot
each, idle devices first; a timed job takes every slot of its devices, once they are all free
at the same moment. Slot 0 is `device{i}.lock`, slot j `device{i}.{j}.lock`.

Leases are granted in the order they were asked for: each asker takes a numbered ticket (a
file it holds locked in `queue/`) and only the oldest living ticket tries for devices; it
gives its ticket back once it holds them. Without the queue, askers that poll for a whole
device compete afresh at every release, and some lose every time: on the shared H200, with
eight timed items waiting for the one GPU, two of them waited out a whole 9-minute call while
twelve others were timed. A ticket whose holder died is unlocked, so it is passed over and
removed.
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


def _slot_path(folder: Path, device: int, slot: int) -> Path:
    return folder / (f"device{device}.lock" if slot == 0 else f"device{device}.{slot}.lock")


def _ticket_number(path: Path) -> int:
    return int(path.name.split(".")[0])


@contextlib.contextmanager
def _turn(folder: Path) -> Iterator[None]:
    """Wait until every ticket taken before this one is gone: a ticket is a file of
    `folder/queue`, held locked by its asker until it has its devices."""
    queue = folder / "queue"
    queue.mkdir(exist_ok=True)
    guard = os.open(folder / "queue.lock", os.O_RDWR | os.O_CREAT, 0o666)
    fd, mine = -1, None
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # numbering and creating a ticket, and pruning,
        try:  # are done under the queue's lock: a ticket is never seen before it is held
            taken = [_ticket_number(p) for p in queue.glob("*.ticket")]
            mine = queue / f"{max(taken, default=0) + 1:012d}.{os.getpid()}.ticket"
            fd = os.open(mine, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
        while True:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                ahead = False
                for other in sorted(queue.glob("*.ticket"), key=_ticket_number):
                    if _ticket_number(other) >= _ticket_number(mine):
                        break
                    held = _try(other)
                    if held is None:  # its asker is alive and waiting
                        ahead = True
                        break
                    os.close(held)  # its asker is gone: its ticket with it
                    with contextlib.suppress(FileNotFoundError):
                        other.unlink()
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)
            if not ahead:
                break
            time.sleep(POLL_S)
        yield
    finally:
        if mine is not None:
            with contextlib.suppress(FileNotFoundError):
                mine.unlink()
        if fd >= 0:
            os.close(fd)
        os.close(guard)


@contextlib.contextmanager
def lease(count: int, total: int, exclusive: bool, folder: Path | None = None, *,
          slots: int = 1, whole: bool = False) -> Iterator[list[int]]:
    """Hold `count` of the node's `total` devices (all of them when exclusive); yields their
    indices. Each device has `slots` slots: a lease takes one slot of each device it holds,
    or all of them when `whole` or exclusive. Blocks until they are free, after every lease
    asked for before it has been granted."""
    folder = folder or lock_dir()
    slots = max(1, int(slots))
    want = total if exclusive else count
    if want > total:
        raise ValueError(f"needs {want} devices, the node has {total}")
    held: dict[tuple[int, int], int] = {}
    try:
        with _turn(folder):
            _acquire(folder, slots, want, total, exclusive, whole, held)
        yield sorted({d for d, _ in held})[:count]
    finally:
        for fd in held.values():
            os.close(fd)


def _acquire(folder: Path, slots: int, want: int, total: int, exclusive: bool, whole: bool,
             held: dict[tuple[int, int], int]) -> None:
    """Lock the slots a lease needs into `held` ((device, slot) -> descriptor), waiting for
    them to be free."""

    def devices() -> list[int]:
        return sorted({d for d, _ in held})

    if exclusive:  # every slot in index order: two exclusive leases cannot deadlock
        for i in range(total):
            for j in range(slots):
                while (i, j) not in held:
                    fd = _try(_slot_path(folder, i, j))
                    if fd is None:
                        time.sleep(POLL_S)
                    else:
                        held[(i, j)] = fd
    else:
        while True:
            if whole:  # devices with every slot free, all their slots
                for i in range(total):
                    if len(devices()) == want:
                        break
                    got = {}
                    for j in range(slots):
                        fd = _try(_slot_path(folder, i, j))
                        if fd is None:
                            break
                        got[(i, j)] = fd
                    if len(got) == slots:
                        held.update(got)
                    else:
                        for fd in got.values():
                            os.close(fd)
            else:  # one slot per device, idle devices first (slot 0 of each, then 1, ...)
                for j in range(slots):
                    for i in range(total):
                        if len(devices()) == want or i in devices():
                            continue
                        fd = _try(_slot_path(folder, i, j))
                        if fd is not None:
                            held[(i, j)] = fd
            if len(devices()) == want:
                break
            for fd in held.values():  # not enough free: give back and wait
                os.close(fd)
            held.clear()
            time.sleep(POLL_S)
