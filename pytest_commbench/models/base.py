"""The interface between a model and the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
    # a model that can be asked again (refinement rounds, agent mode): its conversation about
    # this task and sample, which the harness keeps (models.conversation.Conversation)
    conversation: Asking | None = None


class Asking(Protocol):
    """A conversation with a model about one task and sample, as the strategies use it:
    every prompt and reply kept in a step folder under `folder` and replayed from there (no
    request) by later items and runs."""

    folder: Path  # <runs>/replies/<model>/<task>/s<k>

    def prompt(self) -> str:
        """The task's first prompt, as direct prompting sends it."""

    def ask(self, step: Path, prompt: str | Callable[[], str]) -> Reply:
        """One request kept in `step` (the prompt may be a function: built only if asked)."""

    def again(self, round_: int, previous: str, feedback: str) -> Reply:
        """Refinement round `round_`: the first prompt, the previous reply and its feedback."""

    def ended(self, world: int) -> int | None:
        """The round where an earlier run's refinement for this world size ended early (a pass
        at least as fast as the reference, or the budget), so a rerun asks nothing new."""

    def end(self, world: int, round_: int) -> None:
        """Record that this world size's refinement ended at `round_`."""

    def regenerate(self) -> bool:
        """--commbench-regenerate: ask anew, whatever is kept."""


class Model:
    """Produce candidates for a task. `references` is the hidden references root."""

    name = "model"

    def candidates(self, task: Task, references: Path) -> list[Candidate]:
        raise NotImplementedError
