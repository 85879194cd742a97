"""Collection: a directory with a task.toml is a task; each candidate x world size an item."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .runner import Settings, run_candidate
from .scoring import band
from .session import STATE
from .tasks import MANIFEST, ManifestError, Task, load_task
from .verdicts import Verdict

INFRA_RETRIES = 1


class CommbenchFailure(Exception):
    """An item's result that pytest should report as a failure."""

    def __init__(self, record: dict[str, Any], headline: str) -> None:
        super().__init__(headline)
        self.record = record
        self.headline = headline


class TaskManifest(pytest.File):
    """A task's task.toml; yields one item per (world size, candidate) in a stable order.

    A file node (not a directory node) so that node ids like
    `suites/collective/ring_allreduce/task.toml::ring_allreduce[np4]` select one item."""

    def collect(self):
        state = self.config.stash[STATE]
        try:
            task = load_task(self.path, state.suites)
        except ManifestError as exc:
            raise self.CollectError(str(exc)) from None
        for world in task.ranks:
            for cand in state.model.candidates(task, state.references):
                parts = [f"np{world}"] + ([cand.id] if cand.id else [])
                item = TaskItem.from_parent(self, name=f"{task.name}[{'-'.join(parts)}]",
                                            task=task, world=world, candidate=cand)
                for marker in task.markers():
                    item.add_marker(marker)
                item.add_marker("commbench")
                yield item


class TaskItem(pytest.Item):
    def __init__(self, *, task: Task, world: int, candidate, **kwargs) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.world = world
        self.candidate = candidate
        self.record: dict[str, Any] | None = None

    # -- helpers ---------------------------------------------------------------------------
    def _base_record(self, state) -> dict[str, Any]:
        t = self.task
        return {
            "nodeid": self.nodeid, "run": state.run_id, "task": t.relpath, "title": t.title,
            "category": t.category, "library": t.library, "difficulty": t.difficulty,
            "setup": t.setup, "world": self.world, "model": state.model.name,
            "platform": state.platform.name, "candidate": self.candidate.id,
            "kind": self.candidate.kind, "seed": state.seed,
        }

    def _finish(self, state, record: dict[str, Any]) -> dict[str, Any]:
        record = {**self._base_record(state), **record, "event": "result",
                  "band": band(record.get("speedup")), "fingerprint": state.fingerprint,
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        state.log.write(record)
        self.config.hook.pytest_commbench_result(config=self.config, record=record)
        self.record = record
        self.user_properties.extend(junit_properties(record))
        return record

    # -- pytest protocol ---------------------------------------------------------------------
    def setup(self) -> None:
        state = self.config.stash[STATE]
        reason = state.platform.skip_reason(self.task, self.world)
        if reason:
            self._finish(state, {"verdict": "skipped", "message": reason, "sizes": []})
            pytest.skip(reason)

    def runtest(self) -> None:
        state = self.config.stash[STATE]
        state.log.write({**self._base_record(state), "event": "started",
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        slug = self.nodeid.replace("/", "_").replace("::", "__").replace("[", "_").rstrip("]")
        settings = Settings(
            seed=state.item_seed(self.nodeid), work=state.work_dir / slug,
            cache=state.run_dir / "build", references=state.references, rounds=state.rounds,
            max_rounds=state.max_rounds, precision=state.precision,
            reps=state.reps, max_reps=state.max_reps, budget_s=state.budget,
            warmup=state.warmup, timeout=state.timeout, keep=state.keep,
            exclusive=state.exclusive,
        )
        for _attempt in range(1 + INFRA_RETRIES):
            result = run_candidate(self.task, self.world, self.candidate, state.platform, settings)
            if result["verdict"] != Verdict.INFRA_ERROR.value:
                break
        record = self._finish(state, result)
        verdict = record["verdict"]
        if self.candidate.kind == "mutant":
            if verdict == "pass":
                raise CommbenchFailure(record, "MUTANT SURVIVED: the checker accepted a known-wrong "
                                               "solution (the oracle is too weak)")
            if verdict == "infra_error":
                raise CommbenchFailure(record, "infra_error: the mutant could not be judged")
            return
        if verdict != "pass":
            raise CommbenchFailure(record, f"verdict {verdict}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CommbenchFailure):
            return describe(excinfo.value.record, excinfo.value.headline)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        who = self.candidate.id or self.config.stash[STATE].model.name
        return self.path, None, f"commbench {self.task.relpath} np{self.world} [{who}]"


def describe(record: dict[str, Any], headline: str) -> str:
    lines = [
        f"commbench {headline}",
        f"task {record['task']} ({record['title']}), world size {record['world']}, "
        f"model {record['model']}" + (f", {record['candidate']}" if record.get("candidate") else ""),
        f"verdict: {record['verdict']}",
    ]
    if record.get("message"):
        lines.append(f"  {record['message']}")
    if record.get("detail"):
        lines += ["  " + x for x in str(record["detail"]).splitlines()[-40:]]
    if record.get("output"):
        lines.append("--- output of the ranks (tail) ---")
        lines += str(record["output"]).splitlines()[-30:]
    lines.append(f"seed {record['seed']} (rerun with --commbench-seed={record['seed']})")
    return "\n".join(lines)


SUMMARY_KEYS = ("nodeid", "task", "title", "category", "library", "difficulty", "setup", "world",
                "model", "candidate", "kind", "verdict", "message", "speedup", "speedup_se",
                "timing_rounds", "band", "sizes",
                "cost", "tokens_in", "tokens_out", "seed", "run")


def junit_properties(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """Flat (str, builtin) pairs: one per figure for CI dashboards, plus the summary record."""
    props: list[tuple[str, Any]] = [
        ("commbench.verdict", record["verdict"]),
        ("commbench.task", record["task"]),
        ("commbench.category", record["category"]),
        ("commbench.world_size", record["world"]),
    ]
    if record.get("speedup") is not None:
        props += [("commbench.speedup", round(record["speedup"], 4)),
                  ("commbench.band", record.get("band", ""))]
    if record.get("speedup_se") is not None:
        props += [("commbench.speedup_se", round(record["speedup_se"], 4)),
                  ("commbench.timing_rounds", record.get("timing_rounds"))]
    for s in record.get("sizes", []):
        key = f"commbench.size.{s['count']}.{s['dtype']}"
        props += [
            (f"{key}.speedup", round(s["speedup"], 4)),
            (f"{key}.t_sol_us", round(s["t_sol_us"], 3)),
            (f"{key}.t_ref_us", round(s["t_ref_us"], 3)),
            (f"{key}.spread_sol", round(s["spread_sol"], 4)),
        ]
        if s.get("value_sol") is not None:
            props.append((f"{key}.{s['metric']}_{s['unit']}", round(s["value_sol"], 4)))
    summary = {k: record.get(k) for k in SUMMARY_KEYS}
    props.append(("commbench.record", json.dumps(summary, default=str)))
    return props


def record_from_report(report) -> dict[str, Any] | None:
    for name, value in getattr(report, "user_properties", ()):
        if name == "commbench.record":
            return json.loads(value)
    return None


def is_manifest(path: Path) -> bool:
    return path.name == MANIFEST
