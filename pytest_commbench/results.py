"""The crash-safe JSON-lines results log: a "started" line when an item begins, a "result" line
when it ends, each written with one append so parallel workers never interleave a line.

Every string in a line is capped (`cap`): a solution controls its exception messages and its
output, and a 50 MB message must not make a 100 MB line (or a 100 MB JUnit property)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MESSAGE_CHARS = 2000  # a one-line summary
TEXT_CHARS = 8000  # detail, output, tracebacks and anything else
LIMITS = {"message": MESSAGE_CHARS, "headline": MESSAGE_CHARS}
# fields whose end says most (the last lines of a traceback or of the ranks' output)
TAILS = frozenset({"detail", "output", "traceback", "stderr", "stdout"})
ABORTED = "aborted"  # the verdict of an item that started and never ended


def cap_text(text: str, limit: int, tail: bool = False) -> str:
    """`text` in at most `limit` characters, saying how much was cut (idempotent)."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 64)  # room for the note
    note = f"[... {len(text) - keep:,} characters cut ...]"
    if tail:
        return f"{note}\n{text[len(text) - keep:]}"[-limit:] if keep else note[:limit]
    return f"{text[:keep]}\n{note}"[:limit]


def cap(value: Any, key: str | None = None) -> Any:
    """A copy of a record with every string (values, keys, nested) capped by its field."""
    if isinstance(value, str):
        return cap_text(value, LIMITS.get(key or "", TEXT_CHARS), tail=key in TAILS)
    if isinstance(value, dict):
        return {cap_text(str(k), TEXT_CHARS): cap(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [cap(v, key) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return cap(str(value), key)  # what json would have written with default=str


class ResultsLog:
    def __init__(self, path: Path) -> None:
        self.path = path  # created on the first write: a run that collects nothing leaves nothing

    def write(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(cap(entry), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def end_cleanly(self) -> None:
        """Make the log end with a newline (a session killed mid-write left half a line: the
        next line must not be glued to it)."""
        try:
            with open(self.path, "rb+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == 0:
                    return
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        except FileNotFoundError:
            pass


def entries(path: Path, upto: int | None = None):
    """The parsed lines of a log (the first `upto` bytes of it), skipping any cut short."""
    with open(path, "rb") as f:
        data = f.read() if upto is None else f.read(upto)
    for number, raw in enumerate(data.split(b"\n"), 1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(entry, dict):
            entry.setdefault("nodeid", f"line{number}")
            yield entry


def finished(path: Path, upto: int | None = None) -> dict[str, dict[str, Any]]:
    """The result line of every item that ended, by node id (the last one wins)."""
    return {e["nodeid"]: e for e in entries(path, upto) if e.get("event") == "result"}


def load(path: Path) -> list[dict[str, Any]]:
    """Final records, one per node id (the last result wins); an item that started and never
    finished comes back with verdict "aborted" (a failure of the model: see scoring)."""
    results: dict[str, dict] = {}
    started: dict[str, dict] = {}
    for entry in entries(path):
        key = entry["nodeid"]
        if entry.get("event") == "started":
            started[key] = entry
        elif entry.get("event") == "result":
            results[key] = entry
    for key, entry in started.items():
        if key not in results:
            results[key] = {**entry, "event": "result", "verdict": ABORTED,
                            "message": "the item started and never finished"}
    return list(results.values())


def merge(records_in_order) -> list[dict[str, Any]]:
    """One record per (model, node id) from records of several logs in the order given: a
    later result replaces an earlier one; an "aborted" one only stands where no log has a
    result for the item."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records_in_order:
        key = (str(record.get("model", "?")), str(record.get("nodeid")))
        if record.get("verdict") == ABORTED and key in merged:
            continue
        merged[key] = record
    return list(merged.values())
