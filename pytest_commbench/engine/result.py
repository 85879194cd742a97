"""An attempt's result, typed: what `evaluate` returns. Serialised once (`as_record`) into the
fields of the result line (the JSON schema the logs, reports and hooks read, unchanged); the
reply's text and the precision flag travel with it but are never written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..verdicts import Verdict

#: optional fields: written only where they were measured or said
OPTIONAL = ("check_only", "compile_only", "price_source", "speedup_se", "speedup_ci90", "timing_trust",
            "host_load", "timing_rounds", "timing_stopped", "untimed_phases_us", "job_phases_s",
            "hosts")


@dataclass
class Usage:
    """What one item's answers cost, over every round or step: tokens and cost as this run
    counts them (a kept answer once per run, in the item that got it first), the requests
    behind them, and `spent`, the budget's measure: every answer's cost as recorded when it
    was asked, replayed ones included, so that every world size of a task, and a rerun from
    kept answers, stops where the asking run stopped."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    spent: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    replayed: bool = False

    def add(self, tokens_in: int, tokens_out: int, cost: float | None,
            requests: list[dict[str, Any]], replayed: bool = False) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost or 0.0
        self.spent += (sum(float(q.get("cost") or 0.0) for q in requests) if requests
                       else cost or 0.0)
        self.requests += requests
        self.replayed = self.replayed or replayed

    def parts(self) -> dict[str, Any]:
        """The result's usage fields."""
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "cost": self.cost, "requests": self.requests}


def first_pass(history: list[dict[str, Any]]) -> int | None:
    """The first round of a history that passed (None: none did)."""
    return next((h["round"] for h in history if h["verdict"] == Verdict.PASS), None)


@dataclass
class ItemResult:
    verdict: str
    message: str = ""
    detail: str = ""
    output: str = ""  # the solution's output (tail)
    duration_s: float = 0.0
    # the answer: its usage, the request behind it, whether it was kept from before
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = 0.0
    rounds: int = 1  # the model's own rounds for this answer (a multi-turn source's)
    requests: list[dict[str, Any]] = field(default_factory=list)
    replayed: bool = False
    price_source: dict[str, Any] | None = None
    # what was measured: per-size figures and the speedup, and how far it may be read
    speedup: float | None = None
    sizes: list[dict[str, Any]] = field(default_factory=list)
    check_only: bool | None = None
    compile_only: bool | None = None
    speedup_se: float | None = None
    speedup_ci90: list[float] | None = None
    timing_trust: str | None = None
    host_load: dict[str, Any] | None = None
    timing_rounds: int | None = None
    timing_stopped: str | None = None
    untimed_phases_us: dict[str, Any] | None = None
    # per job of a timed item (check, warmup, ref0, sol0, ...): its start, cases and end in
    # seconds, where an item's time went
    job_phases_s: dict[str, Any] | None = None
    # each rank's host in the item's first job that reached the observer, in rank order (as
    # each rank said when it connected; None for one that never did)
    hosts: list[str | None] | None = None
    # a strategy's parts: every round's verdict and the first round that passed (written
    # together, where the answers could be refined), and an agent's summary (its fields,
    # "agent" and "agent_*", written as they are)
    round_history: list[dict[str, Any]] | None = None
    round: int | None = None
    agent: dict[str, Any] | None = None
    # never written: the reply's text (the next round's prompt quotes it) and whether the
    # speedup is less precise than asked
    reply_text: str = field(default="", repr=False)
    imprecise: bool = field(default=True, repr=False)

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    def as_record(self) -> dict[str, Any]:
        """The result line's fields of this attempt (the run's and the item's are added by
        the plugin)."""
        record: dict[str, Any] = {
            "verdict": self.verdict, "message": self.message, "detail": self.detail,
            "speedup": self.speedup, "sizes": self.sizes, "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out, "cost": self.cost, "rounds": self.rounds,
            "output": self.output, "requests": self.requests, "replayed": self.replayed,
            "duration_s": self.duration_s}
        for name in OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                record[name] = value
        if self.round_history is not None:
            record.update(round=self.round, round_history=self.round_history)
        if self.agent is not None:
            record.update(self.agent)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ItemResult:
        """The attempt's part of a result line (one written by any version: fields it does
        not know are left, fields it lacks keep their defaults)."""
        known = {f.name for f in fields(cls)} - {"reply_text", "imprecise", "round", "agent"}
        result = cls(**{k: v for k, v in record.items() if k in known})
        if result.round_history is not None:
            result.round = record.get("round")
        agent = {k: v for k, v in record.items() if k == "agent" or k.startswith("agent_")}
        if agent:
            result.agent = agent
        return result
