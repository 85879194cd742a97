"""A run's state, kept in the session's stash under `STATE`: the model, the platform, the
secret seed, the run's folders and its results log, what a resumed run already finished.

A run lives in one directory: its results log (`results.jsonl`) and `run.json`, written when
the first item is about to run, which holds the run's secret seed so that `--commbench-resume`
can finish a killed run with the same inputs (resume.py). Jobs never see the runs directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import shards
from .record import ResultLine
from .results import ResultsLog, RunBusy, RunLock, finished
from .settings import RunSettings
from .verdicts import Verdict

STATE = pytest.StashKey["CommbenchState"]()
RUN_FILE = "run.json"


@dataclass
class RunIdentity:
    """Which run a session is: a fresh one, a resumed one or (an xdist worker) its
    controller's; the lock on its folder, and (resuming) the bytes of the log the killed run
    left."""

    seed: int
    run_id: str
    run_dir: Path
    run_lock: RunLock
    shard: shards.Shard | None = None
    run_name: str | None = None
    resume_upto: int | None = None


class KnownNames:
    """Platform (or vendor) names a manifest may list: the built-ins, the one in use, and any a
    plugin's pytest_commbench_make_platform answers to."""

    def __init__(self, builtin, in_use: str, ask: Callable[[str], bool] | None = None) -> None:
        self.names = set(builtin) | {in_use}
        self.ask = ask
        self._asked: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        if name in self.names:
            return True
        if self.ask is None or not isinstance(name, str):
            return False
        if name not in self._asked:
            try:
                self._asked[name] = bool(self.ask(name))
            except Exception:  # noqa: BLE001 - a plugin that cannot make it does not know it
                self._asked[name] = False
        return self._asked[name]

    def __iter__(self):
        return iter(sorted(self.names))


@dataclass
class CommbenchState:
    config: pytest.Config
    model: Any
    platform: Any
    seed: int
    run_id: str
    run_dir: Path
    runs_dir: Path
    work_dir: Path  # items' scratch directories (inputs, outputs, jobs)
    build_dir: Path  # built solutions (the run's own, or --commbench-build-cache)
    references: Path
    suites: Path
    settings: RunSettings  # the options the engine reads, resolved once
    log: ResultsLog
    resume_upto: int | None = None  # resuming: the bytes of the log the killed run left
    manifest_errors: int = 0
    known_platforms: Any = None
    known_vendors: Any = None
    agent: Any = None  # --commbench-agent: what runs a task's candidates (None: direct)
    _fingerprint: dict | None = None
    _resumed: dict[str, ResultLine] | None = field(default=None, repr=False)
    run_lock: RunLock | None = field(default=None, repr=False)  # one session per run folder
    shard: shards.Shard | None = None  # --commbench-shard: the part of the selection run here
    run_name: str | None = None  # the name the shards of one run share

    def item_seed(self, nodeid: str) -> int:
        """Per-item seed: the same item gets the same inputs on any worker, in any order."""
        h = hashlib.sha256(f"{self.seed}:{nodeid}".encode()).digest()
        return int.from_bytes(h[:8], "little")

    @property
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = {
                **self.platform.fingerprint(),
                "sandbox": "namespaces" if not self.settings.unsandboxed else "none (--commbench-unsandboxed)",
            }
        return self._fingerprint

    @property
    def resumed(self) -> dict[str, ResultLine]:
        """Result records the run being resumed already has, by node id (this model's only;
        an `infra_error` is no result: the machine's or the provider's fault, the item runs
        again)."""
        if self._resumed is None:
            self._resumed = {}
            if self.resume_upto and self.log.path.exists():
                self._resumed = {
                    nodeid: record
                    for nodeid, record in finished(self.log.path, self.resume_upto).items()
                    if record.item.model == self.model.name
                    and record.verdict != Verdict.INFRA_ERROR
                }
        return self._resumed

    @property
    def hidden(self) -> tuple[Path, ...]:
        """Trees no job may see, beside those the runner hides (the runs, this run, the project)."""
        return (self.runs_dir, self.run_dir, self.config.rootpath)

    def run_file(self) -> Path:
        return self.run_dir / RUN_FILE

    def write_run_file(self) -> None:
        """Record the run (its seed above all) before its first item: a killed session can then
        be resumed with the same inputs. Rewritten atomically, the resumes appended."""
        path = self.run_file()
        if self.run_lock is not None:
            try:
                self.run_lock.hold()
            except RunBusy as exc:
                raise pytest.UsageError(f"run {self.run_id} ({self.run_dir}): {exc}") from None
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        info = read_run_file(path) or {}
        if info:
            info.setdefault("resumed", []).append(now)
        else:
            info = {"run": self.run_id, "seed": self.seed, "model": self.model.name,
                    "platform": self.platform.name, "started": now,
                    "args": list(self.config.invocation_params.args)}
            if self.shard is not None:
                info[shards.SHARD_KEY] = str(self.shard)
            if self.run_name:
                info[shards.NAME_KEY] = self.run_name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{RUN_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
        tmp.replace(path)


def read_run_file(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
