"""What the engine's parts pass each other: an item's plan, a job's outcome, and the job
runner the measurement is given (the real one runs a job of ranks; tests give a fake)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..verdicts import Verdict

if TYPE_CHECKING:
    from .. import checks, observer
    from ..checks.base import Case
    from ..platforms.base import Platform
    from ..settings import Settings
    from ..tasks import Task


@dataclass
class Outcome:
    """What one job showed: failure (verdict, message, detail) or per-case max-over-ranks times."""

    verdict: Verdict
    message: str = ""
    detail: str = ""
    times: dict[str, list[observer.Timing]] = field(default_factory=dict)
    output: str = ""
    batches: dict[str, int] = field(default_factory=dict)  # calls per timed batch, per case
    seconds: float = 0.0
    # where the job's time went: its start (launch, imports, device set-up, until every rank
    # had connected), its cases (the calls, checks and timing), its end (the ranks' exit)
    phases_s: tuple[float, float, float] | None = None
    # each rank's host, as it said when it connected (None: it never did)
    hosts: list[str | None] | None = None
    # a job over several nodes: each node's clock offset's uncertainty (microseconds)
    clock_skew_us: dict[str, float] | None = None


class InfraError(Exception):
    """The harness, the reference or the machine failed; not the solution's fault."""


@dataclass
class Plan:
    """What every job of one item shares."""

    task: Task
    world: int
    platform: Platform
    settings: Settings
    op: checks.Op
    cases: list[Case]
    deadline: float
    lease_env: dict[str, str] = field(default_factory=dict)  # what the item's GPU lease sets
    # calls per timed batch, per case: chosen by the item's warm-up job, then the same for
    # every reference and solution job
    batches: dict[str, int] = field(default_factory=dict)
    # each rank's node where the run places jobs over nodes (`Platform.layout`); None: every
    # rank on this node
    nodes: list[str] | None = None


class JobRunner(Protocol):
    """Runs one job of `artifact` (a built reference or solution) in `job_dir`: every case of
    the plan, timed or not, with the trials (late ranks, ...) or without; `sanitize` names
    the memory checker's tool every rank runs under (the job then makes its trials only)."""

    def __call__(self, plan: Plan, artifact: Path, job_dir: Path, timed: bool,
                 trials: bool = True, sanitize: str | None = None) -> Outcome: ...
