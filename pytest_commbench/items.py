"""Collection: a directory with a task.toml is a task; each candidate x world size an item."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from . import __version__
from .engine import ItemResult, JobRunner, Settings, refine
from .models.conversation import ITEM
from .record import (
    RESULT,
    STARTED,
    Attempt,
    Identity,
    ResultLine,
    from_junit,
)
from .record import junit_properties as _junit
from .results import entries
from .run_state import STATE
from .scoring import band
from .tasks import MANIFEST, ManifestError, Task, load_task, task_hash
from .verdicts import Verdict

INFRA_RETRIES = 1
WORKER_DIED = "the pytest worker running this item died"
RUNNER = pytest.StashKey[JobRunner]()  # the session's job runner, once asked (`job_runner`)


class CommbenchFailure(Exception):
    """An item's result that pytest should report as a failure."""

    def __init__(self, record: ResultLine, headline: str) -> None:
        super().__init__(headline)
        self.record = record
        self.headline = headline


class TaskManifest(pytest.File):
    """A task's task.toml; yields one item per (world size, candidate) in a stable order.

    A file node (not a directory node) so that node ids like
    `suites/collective/ring_allreduce/task.toml::ring_allreduce[np4]` select one item.
    A manifest that cannot be used is a collection error of this task only (plugin.py lets
    the session go on with the others)."""

    def collect(self):
        state = self.config.stash[STATE]
        try:
            task = load_task(self.path, state.suites, platforms=state.known_platforms,
                             vendors=state.known_vendors)
        except ManifestError as exc:
            state.manifest_errors += 1
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


def base_record(task: Task, world: int, candidate_id: str, kind: str, nodeid: str,
                state) -> Identity:
    """What every line of an item says (never the seed: the "started" line is written before
    the item's jobs run, and a job must find no seed anywhere)."""
    return Identity(
        nodeid=nodeid, run=state.run_id, task=task.relpath, title=task.title,
        category=task.category, library=task.library, difficulty=task.difficulty,
        setup=task.setup, world=world, model=state.model.name,
        # what produced the line: the plugin's version, and the task as it was (a changed
        # task's results are not pooled with the old one's: `commbench report`)
        commbench_version=__version__, task_hash=task_hash(task, state.references),
        platform=state.platform.name, candidate=candidate_id, kind=kind,
        # the run's settings that make its results another configuration of the model (a
        # leaderboard keeps 1-round and 5-round runs, or budgeted ones, apart)
        refine_rounds=state.settings.rounds, budget_usd=state.settings.budget_usd,
        hints=True if state.settings.hints else None,
        agent=state.agent.label if getattr(state, "agent", None) is not None else None)


def final_record(state, base: Identity | Mapping[str, Any],
                 attempt: Attempt | Mapping[str, Any]) -> ResultLine:
    """An item's result line: capped (the solution controls its messages and output), with
    the seed that reproduces its inputs."""
    item = base if isinstance(base, Identity) else Identity.from_json(base)
    attempt = attempt if isinstance(attempt, Attempt) else Attempt.from_json(attempt)
    if attempt.agent is not None and attempt.agent.label is not None:
        item = replace(item, agent=attempt.agent.label)  # the line has one "agent"
    return ResultLine(
        event=RESULT, item=item, attempt=attempt, seed=state.seed,
        band=band(attempt.speedup, attempt.speedup_ci90, attempt.timing_trust),
        fingerprint=state.fingerprint, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z")
    ).capped()


class TaskItem(pytest.Item):
    def __init__(self, *, task: Task, world: int, candidate, **kwargs) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.world = world
        self.candidate = candidate
        self.record: ResultLine | None = None

    # -- helpers ---------------------------------------------------------------------------
    def _base_record(self, state) -> Identity:
        return base_record(self.task, self.world, self.candidate.id, self.candidate.kind,
                           self.nodeid, state)

    def _finish(self, state, attempt: Attempt) -> ResultLine:
        record = final_record(state, self._base_record(state), attempt)
        state.log.write(record)
        self.config.hook.pytest_commbench_result(config=self.config, record=record)
        self._adopt(record)
        return record

    def _adopt(self, record: ResultLine) -> None:
        self.record = record
        self.user_properties.extend(junit_properties(record))

    def _conclude(self, record: ResultLine, note: str = "") -> None:
        """Pass or fail the pytest item as its verdict says."""
        verdict = record.verdict
        if self.candidate.kind == "mutant":
            if verdict == Verdict.PASS:
                raise CommbenchFailure(record, "MUTANT SURVIVED: the checker accepted a known-"
                                               f"wrong solution (the oracle is too weak){note}")
            if verdict == Verdict.INFRA_ERROR:
                raise CommbenchFailure(record, f"infra_error: the mutant could not be judged{note}")
            return
        if verdict != Verdict.PASS:
            raise CommbenchFailure(record, f"verdict {verdict}{note}")

    # -- pytest protocol ---------------------------------------------------------------------
    def setup(self) -> None:
        state = self.config.stash[STATE]
        recorded = state.resumed.get(self.nodeid)
        if recorded is not None:  # finished by the run being resumed: judged in runtest
            if recorded.verdict == Verdict.SKIPPED:
                self._adopt(recorded)
                pytest.skip(str(recorded.result.message or "skipped"))
            return
        reason = state.platform.skip_reason(self.task, self.world)
        if reason:
            self._finish(state, Attempt.partial(verdict=Verdict.SKIPPED.value, message=reason,
                                                sizes=()))
            pytest.skip(reason)

    def runtest(self) -> None:
        state = self.config.stash[STATE]
        recorded = state.resumed.get(self.nodeid)
        if recorded is not None:
            self._adopt(recorded)
            self._conclude(recorded, f" (recorded by run {state.run_id}, resumed)")
            return
        state.log.write(ResultLine.started_line(self._base_record(state),
                                                time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        slug = self.nodeid.replace("/", "_").replace("::", "__").replace("[", "_").rstrip("]")
        settings = Settings.for_item(
            state.settings, seed=state.item_seed(self.nodeid), work=state.work_dir / slug,
            cache=state.build_dir, references=state.references, hide=state.hidden,
            runner=job_runner(self.config))
        # agent mode runs the candidates of a model that can be asked; the rest as always
        agent = state.agent if self.candidate.conversation is not None else None
        run = agent.run if agent is not None else refine
        # the kept answers this item asked for are counted by it, in every attempt and in a
        # resumed run's rerun (models/conversation.py: its record is the one that stands)
        token = ITEM.set(self.nodeid)
        try:
            for _attempt in range(1 + INFRA_RETRIES):
                result = run(self.task, self.world, self.candidate, state.platform, settings)
                if isinstance(result, Mapping):  # a third-party agent of the older contract
                    result = ItemResult.from_json(result)
                if result.verdict != Verdict.INFRA_ERROR.value or refused_key(result):
                    break
        finally:
            ITEM.reset(token)
        record = self._finish(state, result)
        status = refused_key(result)
        if status is not None:
            # a wrong key fails every item alike: the session stops after this one
            self.session.shouldstop = (
                f"commbench: the endpoint refused model {state.model.name}'s request "
                f"({status}): {key_hint(state.model)}; no further item is asked")
        self._conclude(record)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CommbenchFailure):
            return describe(excinfo.value.record, excinfo.value.headline)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        who = self.candidate.id or self.config.stash[STATE].model.name
        return self.path, None, f"commbench {self.task.relpath} np{self.world} [{who}]"


def job_runner(config: pytest.Config) -> JobRunner:
    """The session's job runner: the `pytest_commbench_job_runner` hook's answer, asked once."""
    if RUNNER not in config.stash:
        config.stash[RUNNER] = config.hook.pytest_commbench_job_runner(config=config)
    return config.stash[RUNNER]


def refused_key(result: ItemResult) -> int | None:
    """The status (401, 403) of a request of this result that the endpoint refused, else None
    (`models.providers.refused` marks such requests)."""
    return result.usage.refused()


def key_hint(model) -> str:
    """What to check where a model's key was refused."""
    spec = getattr(model, "spec", None)
    if spec is None:
        return "check its key"
    return (f"check {spec.key_env} (a wrong or revoked key, or one without access to "
            f"{spec.model}) and the endpoint (--commbench-base-url)")


def record_crashed_item(state, nodeid: str, report) -> ResultLine:
    """The controller's end for an item whose xdist worker died while running it: once the
    item had started, a failure of the model (`runtime_error`) where jobs run unsandboxed
    (its solution may have killed the worker), else `infra_error` (a sandboxed job cannot
    signal its worker: it was killed from outside); `infra_error` if it had not started.
    Written to the log, shown in the report."""
    started, result = None, None
    if state.log.path.exists():
        for entry in entries(state.log.path):
            if entry.item.nodeid != nodeid:
                continue
            if entry.event == STARTED:
                started, result = entry, None
            elif entry.event == RESULT:
                result = entry
    why = str(getattr(report, "longrepr", "") or "")
    if result is not None:  # it had ended before its worker died: that end stands
        record = result
    else:
        if started is not None:
            base = started.item
            if state.settings.unsandboxed:  # the solution's processes could reach the worker
                verdict, message = Verdict.RUNTIME_ERROR, WORKER_DIED
            else:  # a job's sandbox (its own PID and user namespaces) cannot: killed from
                # outside, never the model's fault; a resume runs the item again
                verdict, message = Verdict.INFRA_ERROR, (
                    f"{WORKER_DIED} (killed from outside: a sandboxed solution cannot reach it)")
        else:
            base = _base_from_nodeid(state, nodeid)
            verdict, message = (Verdict.INFRA_ERROR,
                                "the pytest worker died before this item started")
        record = final_record(state, base, Attempt.partial(
            verdict=verdict.value, message=message, detail=why, sizes=(), speedup=None))
        state.log.write(record)
        state.config.hook.pytest_commbench_result(config=state.config, record=record)
    report.user_properties = [*getattr(report, "user_properties", ()), *junit_properties(record)]
    report.longrepr = f"{why}\n{describe(record, 'verdict ' + record.verdict)}"
    return record


def _base_from_nodeid(state, nodeid: str) -> Identity:
    path, _, name = nodeid.partition("::")
    world = re.search(r"\[np(\d+)(?:-(.*))?\]$", name)
    candidate = (world.group(2) or "") if world else ""
    kind = "mutant" if candidate.startswith("mutant-") else "solution"
    try:
        task = load_task(state.config.rootpath / path, state.suites)
    except ManifestError:
        return Identity.partial(
            nodeid=nodeid, run=state.run_id, task=path, title="", category="", library="",
            difficulty="", setup="", model=state.model.name, platform=state.platform.name,
            candidate=candidate, kind=kind, world=int(world.group(1)) if world else 0)
    return base_record(task, int(world.group(1)) if world else 0, candidate, kind, nodeid, state)


def describe(record: ResultLine | Mapping[str, Any], headline: str) -> str:
    record = ResultLine.of(record)
    item, attempt = record.item, record.result
    lines = [
        f"commbench {headline}",
        f"task {item.task} ({item.title}), world size {item.world}, "
        f"model {item.model}" + (f", {item.candidate}" if item.candidate else ""),
        f"verdict: {record.verdict}",
    ]
    if attempt.message:
        lines.append(f"  {attempt.message}")
    if attempt.detail:
        lines += ["  " + x for x in str(attempt.detail).splitlines()[-40:]]
    if attempt.output:
        lines.append("--- output of the ranks (tail) ---")
        lines += str(attempt.output).splitlines()[-30:]
    if record.seed is not None:
        lines.append(f"seed {record.seed} (rerun with --commbench-seed={record.seed})")
    return "\n".join(lines)


def junit_properties(record: ResultLine | Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Flat (str, builtin) pairs: one per figure for CI dashboards, plus the summary record
    (the record layer derives both from the typed line)."""
    return _junit(ResultLine.of(record))


def record_from_report(report) -> ResultLine | None:
    return from_junit(getattr(report, "user_properties", ()))


def is_manifest(path: Path) -> bool:
    return path.name == MANIFEST
