"""What an item is evaluated with: the session's options, resolved once, and the item's own
seed and folders.

`RunSettings` carries the options that reach the engine under the options' own names
(`rounds` is refinement rounds, `timing_rounds` the interleaved timing rounds, and so on);
the session builds it once from its option table (`session.OPTIONS`, whose defaults these
mirror: a test holds them equal) and hands it to every item. `Settings` is that plus what
differs per item.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """The options the engine reads (`--commbench-<name>`), resolved."""

    rounds: int = 1  # model generations per task at most (refinement rounds)
    budget_usd: float | None = None  # ... and none once the task's answers cost this much
    check_only: bool = False  # correctness only: no reference job, no timing
    compile_only: bool = False  # the build only: nothing runs
    timing_rounds: int = 2  # interleaved reference/solution rounds at least ...
    timing_max_rounds: int = 6  # ... and at most, while the speedup is less precise than
    timing_precision: float = 0.03  # this (standard error of its log, from the jobs' scatter)
    timing_contended: str = "stop"  # stop: no rounds past the minimum on a contended host
    reps: int = 10  # minimum timed repetitions per size and job
    max_reps: int = 200  # ... and the most, while the time budget lasts
    timing_budget: float = 0.25  # timed seconds per size and job the repetitions may add up to
    # seconds per size and job the observer may spend on the timed repetitions in all (drawing,
    # writing and checking fresh inputs too: what bounds the largest sizes' jobs)
    timing_wall: float = 2.5
    warmup: int = 2
    timeout: float | None = None  # overrides the manifest's per-job deadline
    keep: bool = False  # keep every item's folder
    shared_node: bool = False  # timed items lease only their GPUs, not the whole node
    unsandboxed: bool = False  # jobs without their namespaces
    gpu_batch: bool = False  # GPU jobs batch short calls too
    # the memory checker a compiled answer's extra check job runs under: off, auto (memcheck
    # where the platform has one), or a tool (memcheck, racecheck, synccheck, initcheck)
    sanitizer: str = "off"
    stress: int = 6  # calls back to back after each case's trials (0: no stress phase)
    hints: bool = False  # prompts carry the tasks' hints (another configuration of a model)

    @classmethod
    def from_options(cls, value: Callable[[str], Any]) -> RunSettings:
        """Each field from `value(name)` (the option's resolved value; None: the default)."""
        given = {}
        for f in fields(cls):
            v = value(f.name)
            if v is None:
                continue
            kind = type(f.default) if f.default is not None else float
            given[f.name] = kind(v)
        settings = cls(**given)
        # at least as many repetitions may be taken as must be
        return replace(settings, max_reps=max(settings.max_reps, settings.reps))


@dataclass(frozen=True, kw_only=True)
class Settings(RunSettings):
    """An item's settings: the run's, and its own seed and folders."""

    seed: int  # this item's seed, derived from the run's secret seed
    work: Path  # this item's scratch directory
    cache: Path  # build cache shared by the run
    references: Path
    hide: tuple[Path, ...] = ()  # more trees no job may see (the runs root, the project)
    # what runs the item's jobs: None is the real one (`engine.job.run_job`); the session
    # asks the `pytest_commbench_job_runner` hook (the plugin's own tests answer with a fake)
    runner: Callable[..., Any] | None = None  # an `engine.JobRunner`

    @classmethod
    def for_item(cls, run: RunSettings, **own: Any) -> Settings:
        return cls(**{f.name: getattr(run, f.name) for f in fields(RunSettings)}, **own)
