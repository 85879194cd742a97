"""The crash-safe JSON-lines results log: a "started" line when an item begins, a "result" line
when it ends, each written with one append so parallel workers never interleave a line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class ResultsLog:
    def __init__(self, path: Path) -> None:
        self.path = path  # created on the first write: a run that collects nothing leaves nothing


    def write(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(entry, default=str, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def load(path: Path) -> list[dict[str, Any]]:
    """Final records, one per node id (the last result wins); an item that started and never
    finished comes back with verdict "aborted"."""
    results: dict[str, dict] = {}
    started: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            key = entry.get("nodeid", f"line{number}")
            if entry.get("event") == "started":
                started[key] = entry
            elif entry.get("event") == "result":
                results[key] = entry
    for key, entry in started.items():
        if key not in results:
            results[key] = {**entry, "event": "result", "verdict": "aborted",
                            "message": "the item started and never finished"}
    return list(results.values())
