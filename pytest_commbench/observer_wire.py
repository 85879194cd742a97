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
import socket
from pathlib import Path
from typing import Any

import numpy as np

from . import jobfiles
from .checks.base import Trial
from .rank.protocol import (
    Rank,
    batch_sets,
    guard_file,
    layout,
    set_name,
    views,
)


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
    rank.describe(placed, size, feed, call_info(rank.number, trials, feed, holds, scrub),
                  version)


def call_info(number: int, trials: list[Trial], feed: list, holds: list | None,
              scrub: bool) -> dict[str, Any]:
    """What rank `number`'s control page says of this call besides its layout: its context
    values (per call of a batch, with the batch's feed), its holds, whether it scrubs."""
    batch = len(trials)
    info: dict[str, Any] = {"extra": trials[0].extra[number]}
    if batch > 1:
        info.update(batch=batch, extras=[t.extra[number] for t in trials], feed=feed)
    if holds:  # this rank's holds, per call: [seconds, where] or None
        info["holds"] = [[h[1], h[2]] if h and h[0] == number else None for h in holds]
    if scrub:
        info["scrub"] = True
    return info


def input_arrays(number: int, trials: list[Trial]) -> list[tuple[str, np.ndarray]]:
    """Rank `number`'s inputs of this call, (name, array) in the order they are written (a
    batch's: every call's in order, as its feed takes them)."""
    return [(name, a) for t in trials for name, a in t.inputs[number].items()]


def write_inputs(rank: Rank, trials: list[Trial]) -> None:
    """The rank's inputs of this call: into its segment, or a batch's, every call's in order,
    into its feed."""
    arrays = input_arrays(rank.number, trials)
    if len(trials) > 1:  # a batch: every call's inputs in order into the rank's feed
        rank.feed(b"".join(np.ascontiguousarray(a).tobytes() for _n, a in arrays))
        return
    rank.put(arrays)


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
