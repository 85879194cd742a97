"""An attempt's result, typed: what `evaluate` returns is the record layer's `Attempt`
(`ItemResult`, the name strategies know it by), serialised once by the record layer into the
fields of the result line; the reply's text and the precision flag travel with it but are
never written. `Usage` adds up what an item's answers cost over every round or step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import record
from ..record import Attempt, Round

#: an attempt's result (the record layer's `Attempt`), as strategies name it
ItemResult = Attempt


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
            requests: Iterable[dict[str, Any]], replayed: bool = False) -> None:
        requests = list(requests)
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost or 0.0
        self.spent += (sum(record.request_cost(q) for q in requests) if requests
                       else cost or 0.0)
        self.requests += requests
        self.replayed = self.replayed or replayed

    def add_usage(self, usage: record.Usage) -> None:
        """Add an attempt's usage."""
        self.add(usage.tokens_in, usage.tokens_out, usage.cost, usage.requests, usage.replayed)

    def value(self, kept: record.Usage, replayed: bool | None = None) -> record.Usage:
        """The usage as the item's result says it: every answer's tokens, cost and requests,
        with the price of the answer `kept` and whether answers were replayed (the kept
        answer's where not given)."""
        return record.Usage(tokens_in=self.tokens_in, tokens_out=self.tokens_out,
                            cost=self.cost, requests=tuple(self.requests),
                            replayed=kept.replayed if replayed is None else replayed,
                            price_source=kept.price_source)


def first_pass(history: Iterable[Round | Mapping[str, Any]]) -> int | None:
    """The first round of a history that passed (None: none did)."""
    return next((h.round for h in map(Round.of, history) if h.passed), None)
