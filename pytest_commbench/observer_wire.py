"""The observer's side of the rank protocol (`rank/protocol.py`): what goes to a rank and what
comes back. A rank's hello on the job's Unix socket and the pages it is handed there (control
page, data segment, doorbell, wake-up pipe, feed); the lines it says on that socket; a call's
buffers described on its control page with its outputs poisoned; its inputs written into its
segment or feed; its outputs read back from its segment; and the reports its run-time guard
left in the job's folder.

Nothing here decides anything: what a message or a word means for the verdict is the
observer's (`observer.py`).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np

from . import jobfiles
from .checks.base import Trial
from .rank.protocol import (
    Control,
    batch_sets,
    feed_pipe,
    guard_file,
    layout,
    memfd,
    poison_value,
    set_name,
    views,
)

CONTROL_BYTES = 1 << 16
# the word a rank's harness answers each of the observer's steps with
ANSWER = {"prep": "ready", "gate": "done", "fetch": "saved"}


class Rank:
    def __init__(self, conn: socket.socket, number: int) -> None:
        self.conn, self.number = conn, number
        self.ctl_fd = memfd(f"commbench-ctl-{number}", CONTROL_BYTES)
        self.ctl = Control(self.ctl_fd)
        self.data_fd = -1
        self.data = None
        # the rank's wake-up call: a byte after every word the observer sets for it, so a
        # rank that waits long sleeps in the kernel instead of spinning
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # a batch's inputs, call after call (protocol.py): the rank reads, the observer writes
        self.feed_r, self.feed_w, self.feed_bytes = feed_pipe()
        self.data_bytes = 0
        self.buffer = b""
        self.placed: list[list] = []
        self.fed: list = []  # a batch's inputs per call (name, shape, dtype), as last laid out

    @classmethod
    def greeted(cls, conn: socket.socket, number: int, bell: int) -> Rank:
        """Rank `number`, whose harness said hello on `conn`: handed its control page, data
        segment, the observer's doorbell (`bell`), its wake-up pipe and its feed's read end."""
        rank = cls(conn, number)
        rank.grow(1 << 16)
        socket.send_fds(conn, [json.dumps({"data_bytes": rank.data_bytes}).encode()],
                        [rank.ctl_fd, rank.data_fd, bell, rank.wake_r, rank.feed_r])
        os.close(rank.feed_r)  # the rank's end alone
        rank.feed_r = -1
        conn.setblocking(False)
        return rank

    def grow(self, size: int) -> None:
        """A data segment of at least `size` bytes (a new memory file, sent to the rank)."""
        import mmap

        size = max(size, 4096)
        if self.data_fd >= 0:
            os.close(self.data_fd)
        self.data_fd = memfd(f"commbench-data-{self.number}", size)
        self.data = mmap.mmap(self.data_fd, size)
        self.data_bytes = size

    def set(self, word: str, value: int) -> None:
        self.ctl.set(word, value)
        try:
            os.write(self.wake_w, b"!")
        except (BlockingIOError, OSError):  # full (the rank is awake anyway) or closed
            pass

    def read(self) -> tuple[int, list]:
        """What the rank said on its socket (one read): the bytes read, and the messages whose
        lines are whole now (a line too long for the harness's short messages, or one that is
        no JSON, is passed over)."""
        try:
            data = self.conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            return 0, []
        self.buffer = (self.buffer + data)[-65536:]
        messages = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if len(line) > 1024:  # the harness's messages are short: nothing to read
                continue
            try:
                messages.append(json.loads(line))
            except Exception:  # noqa: BLE001 - whatever a rank sends, the observer lives
                continue
        return len(data), messages

    def outputs(self, names) -> dict[str, np.ndarray]:
        """A copy of the outputs `names` of a single call, as they are in the segment now."""
        return {n: np.array(a) for n, a in views(self.data, self.placed).items() if n in names}

    def close(self) -> None:
        for fd in (self.ctl_fd, self.data_fd, self.wake_r, self.wake_w, self.feed_r,
                   self.feed_w):
            if fd >= 0:
                os.close(fd)
        self.ctl_fd = self.data_fd = self.wake_r = self.wake_w = self.feed_r = self.feed_w = -1
        try:
            self.conn.close()
        except OSError:
            pass


def read_hello(conn: socket.socket) -> tuple[int, str | None] | None:
    """The rank a new connection claims and the host its harness says it runs on (None where
    the host is no short printable name); None, the connection closed, where no claim can be
    read."""
    try:
        hello = json.loads(conn.recv(4096).split(b"\n")[0])
        number = int(hello["rank"])
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None
    host = hello.get("host") if isinstance(hello, dict) else None
    if not (isinstance(host, str) and 0 < len(host) <= 255 and host.isprintable()):
        host = None
    return number, host


def plan_layouts(ranks: list[Rank], trials: list[Trial]
                 ) -> tuple[list[tuple[list, int]], list[list], bool]:
    """Each rank's buffers for this call (one set per call of a batch) and the size of segment
    they take; each rank's feed (a batch's inputs per call: name, shape, dtype); and whether
    any of them changed since the last call."""
    layouts = []
    batch = len(trials)
    for number in range(len(ranks)):
        specs = []
        for j, trial in enumerate(trials):
            if batch == 1:  # a batch's inputs go through the feed, not the segment
                specs += [(n, "in", a.shape, a.dtype)
                          for n, a in trial.inputs[number].items()]
            specs += [(set_name(n, j, batch), "out", shape, dtype)
                      for n, (shape, dtype) in trial.outputs[number].items()]
        layouts.append(layout(specs))
    # a batch's inputs come through the feed: where their shapes change, so does the
    # layout (a staged rank keeps each call's device inputs for the layout's life)
    feeds = [[[[n, [int(x) for x in a.shape], str(a.dtype)] for n, a in t.inputs[r].items()]
              for t in trials] if batch > 1 else [] for r in range(len(ranks))]
    changed = any(p != r.placed or f != r.fed
                  for r, (p, _), f in zip(ranks, layouts, feeds))
    return layouts, feeds, changed


def describe_call(rank: Rank, placed: list, size: int, feed: list, trials: list[Trial],
                  holds: list | None, scrub: bool, version: int) -> None:
    """Describe this call's buffers on the rank's control page (layout `version`) and poison
    its outputs; a segment too small for them is replaced by a bigger one, sent to the rank."""
    number, batch = rank.number, len(trials)
    remap = size > rank.data_bytes
    if remap:
        rank.grow(size * 2)
    rank.placed = placed
    rank.fed = feed
    v = views(rank.data, placed)
    inputs = {e[0] for e in placed if e[1] == "in"}
    for name, kind, _shape, _dtype, _off in placed:
        if kind == "out" and name not in inputs:
            v[name].fill(poison_value(v[name].dtype))
    info: dict[str, Any] = {"layout": placed, "extra": trials[0].extra[number]}
    if batch > 1:
        info.update(batch=batch, extras=[t.extra[number] for t in trials], feed=feed)
    if holds:  # this rank's holds, per call: [seconds, where] or None
        info["holds"] = [[h[1], h[2]] if h and h[0] == number else None for h in holds]
    if scrub:
        info["scrub"] = True
    if remap:
        info["remap"] = rank.data_bytes
    rank.ctl.write_info(info)
    rank.ctl.set("layout_version", version)
    if remap:
        socket.send_fds(rank.conn, [b"{}"], [rank.data_fd])


def write_inputs(rank: Rank, trials: list[Trial]) -> None:
    """The rank's inputs of this call: into its segment, or a batch's, every call's in order,
    into its feed."""
    number = rank.number
    if len(trials) > 1:  # a batch: every call's inputs in order into the rank's feed
        data = b"".join(np.ascontiguousarray(a).tobytes()
                        for t in trials for a in t.inputs[number].values())
        wrote = os.write(rank.feed_w, data) if data else 0
        if wrote != len(data):  # the last batch's inputs were not all read
            raise RuntimeError(f"rank {number}'s feed took {wrote} of {len(data)} bytes")
        return
    v = views(rank.data, rank.placed)
    for name, value in trials[0].inputs[number].items():
        v[name][...] = value


def call_outputs(ranks: list[Rank], trial: Trial, j: int, batch: int
                 ) -> list[dict[str, np.ndarray]]:
    """A copy of every rank's outputs of call j of a batch (its buffer set), as they are now."""
    sets = [batch_sets(views(r.data, r.placed), batch)[j] for r in ranks]
    return [{n: np.array(a) for n, a in sets[r.number].items() if n in trial.outputs[r.number]}
            for r in ranks]


def guard_reports(out: Path, world: int) -> list[dict]:
    """Reports the run-time guard wrote (a forbidden call ended a rank): `guard_r<rank>.json`
    of each rank in the job's `out` folder, read as `jobfiles` reads a job's files (never
    through a link, never a FIFO, 8 KiB at most)."""
    found = []
    for rank in range(world):
        data = jobfiles.read(out.parent, f"{out.name}/{guard_file(rank)}", 8192)
        if data is None:
            continue
        try:
            line = data.decode(errors="replace").splitlines()[0]
            report = json.loads(line)
            found.append(report if isinstance(report, dict) else {"forbidden": str(report)})
        except Exception:  # noqa: BLE001 - a report the solution mangled is still a report
            found.append({"forbidden": "(unreadable report)"})
    return found
