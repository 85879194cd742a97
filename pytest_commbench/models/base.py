"""The interface between a model and the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..tasks import Task


@dataclass
class Reply:
    """What a model gave for one task: a full file or just its regions (or nothing).

    `text` is the reply as the model gave it; bytes that were not UTF-8 are kept as surrogate
    escapes (`errors="surrogateescape"`), which the merge turns into `no_solution`."""

    text: str | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    rounds: int = 1
    # the source could not answer at all (an API outage): infra_error, not the model's fault
    infra_error: str | None = None
    # the reply was cut at the output-token limit: the item's verdict is `truncated`
    truncated: bool = False
    # kept from an earlier item or run (no request sent): its tokens and cost are the ones
    # recorded when it was asked (zero where another item of this run already counted them)
    replayed: bool = False
    # the request behind the reply (endpoint, model id, settings asked, usage, seconds,
    # finish reason, cost and price source), as usage.json keeps it; None: no request
    request: dict[str, Any] | None = None


@dataclass
class Candidate:
    """One thing to score on one task; one pytest item per candidate and world size."""

    id: str  # "" for the model's own solution, else e.g. the mutant's name
    kind: str  # "solution": must pass; "mutant": must be rejected
    produce: Callable[[], Reply]
    # refinement (models that can be asked again): (round, previous reply, feedback) -> Reply
    refine: Callable[[int, str, str], Reply] | None = None
    # where an earlier run's conversation for this world size ended early (a pass at least as
    # fast as the reference, or the budget): (world) -> round or None, and (world, round) to
    # record it, so that a rerun replays the same rounds and asks nothing new
    ended: Callable[[int], int | None] | None = None
    end: Callable[[int, int], None] | None = None
    # a model that can be asked anything (agent mode): its prompts, replies and costs kept
    # under the runs directory like the refinement rounds'
    asker: Asker | None = None


@dataclass
class Asker:
    """What agent mode needs of a model: the sample's folder under `<runs>/replies/`, the
    task's prompt as direct prompting sends it, and a request whose prompt and reply are kept
    in a step folder and replayed from there (no request) on a rerun."""

    folder: Callable[[], Path]  # <runs>/replies/<model>/<task>/s<k>
    prompt: Callable[[], str]  # the task's first prompt
    # (step folder, prompt text or a function that builds it) -> reply, kept and replayed
    ask: Callable[[Path, str | Callable[[], str]], Reply]
    regenerate: Callable[[], bool] = lambda: False  # --commbench-regenerate: ask anew


class Model:
    """Produce candidates for a task. `references` is the hidden references root."""

    name = "model"

    def candidates(self, task: Task, references: Path) -> list[Candidate]:
        raise NotImplementedError
