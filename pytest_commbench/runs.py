"""The runs of a runs folder: what each one holds (`commbench runs`), its label
(`commbench label`), and which of them `commbench report` takes when it is given the folder.

A run folder names no model, so what a run is comes from its `run.json` (seed, model,
platform, start, the label given it) and its results log (the items, their verdicts). Given a
runs folder, a report takes one run per model and configuration (rounds, budget, agent,
hints, label): of its runs in which some item ran (not skipped), the one in which the most
items ran, the newest of those. Every run left out is named in one line with why, so a
one-item rerun or an all-skipped run never stands for a model's full run unnoticed. The
shards of one run (`--commbench-shard`, one run name) count as one run there, their items
together (shards.merge checks that they make one)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import shards
from .record import Identity, ResultLine
from .results import load
from .verdicts import Verdict

RUN_FILE = "run.json"  # as session.RUN_FILE (not imported: the report needs no pytest)
LOG = "results.jsonl"


@dataclass
class Run:
    folder: Path
    records: list[ResultLine]
    info: dict = field(default_factory=dict)  # run.json

    @property
    def log(self) -> Path:
        return self.folder / LOG

    @property
    def run_id(self) -> str:
        ids = sorted({str(r.item.run) for r in self.records if r.item.run})
        return str(self.info.get("run") or (ids[0] if ids else self.folder.name))

    @property
    def models(self) -> list[str]:
        found = sorted({str(r.item.model) for r in self.records if r.item.model})
        return found or ([str(self.info["model"])] if self.info.get("model") else [])

    @property
    def started(self) -> str:
        """When the run began (run.json, else its first item), as ISO text; '' if unknown."""
        if self.info.get("started"):
            return str(self.info["started"])
        times = sorted(str(r.started) for r in self.records if r.started)
        return times[0] if times else ""

    @property
    def platform(self) -> str:
        found = sorted({str(r.item.platform) for r in self.records if r.item.platform})
        return ", ".join(found) or str(self.info.get("platform") or "-")

    @property
    def seed(self):
        if self.info.get("seed") is not None:
            return self.info["seed"]
        return next((r.seed for r in self.records if r.seed is not None), None)

    @property
    def label(self) -> str | None:
        return self.info.get("label") or None

    @property
    def shard(self) -> shards.Shard | None:
        return shards.of(self.info)

    @property
    def run_name(self) -> str | None:
        return self.info.get(shards.NAME_KEY) or None

    @property
    def ran(self) -> int:
        """Items that ran: every item with a record but the skipped ones."""
        return sum(1 for r in self.records if r.verdict != Verdict.SKIPPED)

    @property
    def passes(self) -> int:
        return sum(1 for r in self.records if r.passed and r.is_solution)

    @property
    def key(self) -> tuple:
        """The entry of a leaderboard this run feeds: its models, configuration and label."""
        first = next((r for r in self.records if r.is_solution),
                     self.records[0] if self.records else None)
        item = first.item if first is not None else Identity()
        return (tuple(self.models), item.refine_rounds, item.budget_usd, item.agent,
                bool(item.hints), self.label)

    def order(self) -> tuple:
        """Newest last: by start, then by the log's modification time."""
        return (self.started, self.log.stat().st_mtime if self.log.exists() else 0.0)


def read_info(folder: Path) -> dict:
    try:
        info = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def read(folder: Path) -> Run:
    log = folder / LOG
    return Run(folder, load(log) if log.is_file() else [], read_info(folder))


def is_run(path: Path) -> bool:
    return (path / LOG).is_file()


def runs_in(root: Path) -> list[Run]:
    """Every run folder directly below `root` (one with a results log), newest first."""
    found = [read(p.parent) for p in root.glob(f"*/{LOG}")]
    return sorted(found, key=Run.order, reverse=True)


def pick(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """The runs a report takes from a runs folder (one per model and configuration: the most
    items ran, then the newest), and a line for each run left out saying why."""
    notes: list[str] = []
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        if run.ran == 0:
            why = "every item skipped" if run.records else "no item recorded"
            notes.append(f"left out run {run.run_id} ({describe(run)}): {why}")
            continue
        groups.setdefault(run.key, []).append(run)
    chosen = []
    for group in groups.values():
        # a whole run stands alone; the shards of one run name stand together (and
        # are refused together where they overlap: shards.merge)
        parts: dict[tuple, list[Run]] = {}
        for run in group:
            shard = run.shard
            parts.setdefault((run.run_name,) if shard and run.run_name else (id(run),),
                             []).append(run)
        candidates = list(parts.values())
        best = max(candidates, key=lambda c: (sum(r.ran for r in c), max(r.order() for r in c)))
        chosen += best
        for candidate in candidates:
            if candidate is not best:
                for run in candidate:
                    notes.append(f"left out run {run.run_id} ({describe(run)}): {_name(best)} "
                                 f"of the same model ran {sum(r.ran for r in best)} items "
                                 f"(give {run.folder} to report this one)")
    return sorted(chosen, key=Run.order, reverse=True), notes


def _name(runs: list[Run]) -> str:
    if len(runs) == 1 and runs[0].shard is None:
        return f"run {runs[0].run_id}"
    parts = ", ".join(str(r.shard) for r in sorted(runs, key=lambda r: r.shard))
    return f"shard{'s' * (len(runs) > 1)} {parts} of run {runs[0].run_name}"


def describe(run: Run) -> str:
    label = f" [{run.label}]" if run.label else ""
    if run.shard is not None:
        label += f" shard {run.shard}" + (f" of {run.run_name}" if run.run_name else "")
    return f"{', '.join(run.models) or '?'}{label}, {run.started or 'date unknown'}, " \
           f"{run.ran} items ran"


def set_label(folder: Path, label: str) -> None:
    """Keep a run's label in its run.json (an empty label removes it), written atomically:
    a resume rewrites run.json keeping what it holds."""
    info = read_info(folder)
    if label:
        info["label"] = label
    else:
        info.pop("label", None)
    tmp = folder / f".{RUN_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(info, indent=1, default=str) + "\n")
    tmp.replace(folder / RUN_FILE)
