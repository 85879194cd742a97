"""The crash-safe JSON-lines results log: a "started" line when an item begins, a "result" line
when it ends, each written with one append so parallel workers never interleave a line.

Every string in a line is capped (`cap`): a solution controls its exception messages and its
output, and a 50 MB message must not make a 100 MB line (or a 100 MB JUnit property).

A full disk loses no finished line and leaves no half line: each line is one `os.write` of
the whole line to the log opened for appending, under a lock that every writer of the log
takes (xdist workers too); a write that comes back short or fails for want of room is cut
back to where the line began (`ftruncate`), and the line is kept and written before the
next one, or when the process ends (pytest's own report has the item meanwhile). A reader
skips a line cut short by a crash, and recovers a whole line written after one; a line that
parses but is no record a report or a resume can use (`problem`: a missing node id, a
speedup that is not a finite positive number, a negative cost...) is skipped too, saying
which file and line, and the rest is read.

One session per run folder (`RunLock`): the session's controller holds `session.lock`
(naming its pid) for the session, and its pytest-xdist workers hold `workers.lock` shared
while they write, so a second session of the same run is refused while either lives."""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .record import (
    ABORTED,
    MESSAGE_CHARS,
    RESULT,
    STARTED,
    TEXT_CHARS,
    RecordError,
    ResultLine,
    as_lines,
    cap,
    cap_text,
    looks_like_line,
    problem,
)

# the caps of a line's strings are the record layer's (re-exported for the log's users)
__all__ = ["ABORTED", "MESSAGE_CHARS", "TEXT_CHARS", "cap", "cap_text", "ResultsLog", "RunLock",
           "RunBusy", "entries", "finished", "load", "merge", "problem"]


# a write that fails for want of room: the line waits for the next write
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class ResultsLog:
    def __init__(self, path: Path, before_write: Callable[[], None] | None = None) -> None:
        self.path = path  # created on the first write: a run that collects nothing leaves nothing
        self.pending: list[bytes] = []  # finished lines not in the log yet (a full disk)
        self.before_write = before_write  # called once, before the first write
        self._retry_registered = False
        self._warned = False

    def write(self, line: ResultLine | Mapping[str, Any]) -> None:
        """Append one line (capped); on a full disk keep it (and say so on stderr) and write
        it before the next line or at exit. Other errors are raised, the log left as it was."""
        self.pending.append((ResultLine.of(line).dumps() + "\n").encode())
        self.flush()

    def flush(self) -> bool:
        """Write the lines kept back, in order; True when none is left."""
        if not self.pending:
            return True
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # every writer's lines begin where it looked
            while self.pending and self._append(fd, self.pending[0]):
                self.pending.pop(0)
        finally:
            os.close(fd)  # and the lock with it
        if self.pending:
            if not self._retry_registered:
                self._retry_registered = True
                atexit.register(self._last_try)
            if not self._warned:
                self._warned = True
                sys.stderr.write(f"commbench: no room in {self.path}: {len(self.pending)} "
                                 "result line(s) kept to be written with the next one\n")
        elif self._warned:
            self._warned = False
            sys.stderr.write(f"commbench: the result lines kept back are in {self.path} now\n")
        return not self.pending

    def _append(self, fd: int, line: bytes) -> bool:
        """One line at the log's end, whole or not at all; False: no room for it."""
        size = os.fstat(fd).st_size
        # a writer killed mid-line left half a line: this one starts on a line of its own
        data = line if size == 0 or os.pread(fd, 1, size - 1) == b"\n" else b"\n" + line
        try:
            written = os.write(fd, data)
            if written == len(data):
                os.fsync(fd)
                return True
            error: OSError | None = None
        except OSError as exc:
            error = exc
        os.ftruncate(fd, size)  # no half line stays behind
        if error is not None and error.errno not in NO_ROOM:
            raise error
        return False

    def _last_try(self) -> None:
        try:
            if self.flush():
                return
        except OSError:
            pass
        if self.pending:
            sys.stderr.write(f"commbench: {len(self.pending)} result line(s) could not be "
                             f"written to {self.path} (no room); pytest's report has them\n")

    def end_cleanly(self) -> None:
        """Make the log end with a whole line: a session killed mid-write left half a line,
        which is cut off (a last line that is whole but for its newline gets one)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
                return
            back = min(size, 1 << 20)
            chunk = os.pread(fd, back, size - back)
            cut = chunk.rfind(b"\n")
            last = chunk[cut + 1:]
            if _parse(last) is not None or (cut < 0 and back < size):
                os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, b"\n")
            else:
                os.ftruncate(fd, size - len(last))
        finally:
            os.close(fd)


def _parse(raw: bytes) -> dict | None:
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _recover(raw: bytes) -> dict | None:
    """A whole line glued after one cut short (a log written before lines were cut back):
    the last part of `raw` that is a record by itself. A record's own inner objects follow
    ": ", ", " or "[" (json.dumps' separators): only a "{" after anything else is tried, so
    a torn line of a megabyte is read in one pass, not once per inner object."""
    at = raw.find(b'{"', 1)
    while at > 0:
        if raw[at - 1:at] not in (b" ", b"["):
            entry = _parse(raw[at:])
            if looks_like_line(entry):
                return entry
        at = raw.find(b'{"', at + 1)
    return None


def _unreadable(raw: bytes) -> str:
    try:
        json.loads(raw)
    except ValueError:
        return (f"not a whole JSON line ({len(raw):,} bytes; cut short by a crash or edited "
                f"by hand)")
    return "a JSON value that is not an object"


def _say_skipped(path: Path, number: int, reason: str) -> None:
    print(f"commbench: {path}:{number}: line skipped: {reason}", file=sys.stderr)


# -- one session per run folder ----------------------------------------------------------------

SESSION_LOCK = "session.lock"
WORKERS_LOCK = "workers.lock"


class RunBusy(Exception):
    """Another session uses the run folder; the message names its controller's pid."""


class RunLock:
    """One session per run folder. The controller (`hold`) takes `session.lock` alone for the
    whole session and writes its pid into it; its pytest-xdist workers (`join`) take
    `workers.lock` shared, and the controller makes sure, when it takes the folder, that no
    one holds that one either (the workers of a killed controller may still be finishing an
    item). The locks are `flock`s: they end with the processes that hold them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.fds: list[int] = []

    def _open(self, name: str) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return os.open(self.run_dir / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                       0o644)

    def hold(self) -> None:
        """Take the folder for this session; RunBusy if another one has it."""
        if self.fds:
            return
        fd = self._open(SESSION_LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunBusy(f"it is in use by {holder}") from None
        workers = self._open(WORKERS_LOCK)
        try:
            fcntl.flock(workers, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(workers)
            os.close(fd)
            raise RunBusy(f"pytest-xdist workers of {holder} still use it") from None
        fcntl.flock(workers, fcntl.LOCK_UN)
        os.close(workers)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[:20]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fds.append(fd)

    def join(self, wait_s: float = 30.0) -> None:
        """A worker of the session that holds the folder: a shared hold on `workers.lock`
        (waiting out another session's check, which holds it alone for a moment)."""
        if self.fds:
            return
        fd = self._open(WORKERS_LOCK)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # the session's controller holds the folder anyway
                time.sleep(0.05)
        self.fds.append(fd)

    def release(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


def _holder(fd: int) -> str:
    """Who holds a session lock, as its file says."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or not info.get("pid"):
        return "another pytest session"
    since = f", since {info['since']}" if info.get("since") else ""
    host = f" on {info['host']}" if info.get("host") else ""
    return f"the pytest session of pid {info['pid']}{host}{since}"


def entries(path: Path, upto: int | None = None,
            skipped: Callable[[Path, int, str], None] | None = _say_skipped
            ) -> Iterator[ResultLine]:
    """The lines of a log (the first `upto` bytes of it), typed: a line cut short by a crash
    is skipped (never an item's record, and a whole one glued after it is found again); a
    line that parses but is no usable record (`record.problem`) is skipped and reported to
    `skipped` (file, line number, why; by default a line on stderr)."""
    with open(path, "rb") as f:
        data = f.read() if upto is None else f.read(upto)
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        raw = raw.strip()
        if not raw:
            continue
        entry = _parse(raw)
        if entry is None:
            entry = _recover(raw)
            if entry is None:
                # the unterminated end is a write cut short (or still going on): silent;
                # a whole line that is no JSON object was cut or edited: said
                if skipped is not None and number < len(lines):
                    skipped(path, number, _unreadable(raw))
                continue
        try:
            yield ResultLine.read(entry)
        except RecordError as why:
            if skipped is not None:
                skipped(path, number, str(why))


def finished(path: Path, upto: int | None = None) -> dict[str, ResultLine]:
    """The result line of every item that ended, by node id (the last one wins)."""
    return {e.item.nodeid: e for e in entries(path, upto) if e.event == RESULT}


def load(path: Path) -> list[ResultLine]:
    """Final records, one per node id (the last result wins); an item that started and never
    finished comes back with verdict "aborted" (a failure of the model: see scoring)."""
    results: dict[str, ResultLine] = {}
    started: dict[str, ResultLine] = {}
    for entry in entries(path):
        (started if entry.event == STARTED else results)[entry.item.nodeid] = entry
    for key, entry in started.items():
        if key not in results:
            results[key] = entry.aborted()
    return list(results.values())


def merge(records_in_order: Iterable[ResultLine | Mapping[str, Any]]) -> list[ResultLine]:
    """One record per (model, node id) from records of several logs in the order given: a
    later result replaces an earlier one; an "aborted" one only stands where no log has a
    result for the item."""
    merged: dict[tuple[str, str], ResultLine] = {}
    for record in as_lines(records_in_order):
        key = (str(record.item.model or "?"), str(record.item.nodeid))
        if record.verdict == ABORTED and key in merged:
            continue
        merged[key] = record
    return list(merged.values())
