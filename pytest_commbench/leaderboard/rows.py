"""The rows of the leaderboard's tables as typed values, read by their fields in this package.

A row turns into its dict in one place (`Row.as_dict`): the form of leaderboard.json and,
with None as "", of leaderboard.csv, which `LeaderboardRow.from_csv` reads back typed. A row
is also a read-only mapping of that dict (`row["pass_rate"]`), for scripts written against
the dicts, and compares equal to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from ..scoring import FAST_P

METRICS = ("pass_x_gm", "pass_rate", "pass_good", "gm_speedup")


@dataclass(frozen=True, eq=False)
class Row(Mapping):
    """A row of a table: its fields, and its dict as a mapping view (equality included)."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @cached_property
    def _dict(self) -> dict[str, Any]:
        return self.as_dict()

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)


def _fast_column(p: float) -> str:
    return f"fast_{p:g}"


def _boolean(text: str) -> bool:
    return text == "True"


#: how a column of leaderboard.csv is read back, by the type its field is declared with
_READERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _boolean,
                                             "str": str}


@dataclass(frozen=True, eq=False)
class LeaderboardRow(Row):
    """Table 2's row of an entry: every column of leaderboard.csv and of a model in
    leaderboard.json, each interval as its bounds (`<metric>_lo`, `<metric>_hi`)."""

    rank: int | None
    tier: int | None
    model: str
    label: str
    tasks: int
    passes: int
    good: int
    not_applicable: int
    pass_x_gm: float | None
    pass_x_gm_lo: float | None
    pass_x_gm_hi: float | None
    pass_rate: float | None
    pass_rate_lo: float | None
    pass_rate_hi: float | None
    pass_good: float | None
    pass_good_lo: float | None
    pass_good_hi: float | None
    gm_speedup: float | None
    gm_speedup_lo: float | None
    gm_speedup_hi: float | None
    open_weights: bool | None
    price: float | None
    paper_price: float | None
    refine_rounds: int | None
    budget_usd: float | None
    runs: str  # the entry's runs, space-separated
    fast: tuple[tuple[float, float | None], ...] = ()  # (p, fast_p) for each p of FAST_P

    def interval(self, metric: str) -> list[float] | None:
        """A metric's interval, None where it has none."""
        lo, hi = getattr(self, f"{metric}_lo"), getattr(self, f"{metric}_hi")
        return None if lo is None else [lo, hi]

    def fast_p(self, p: float) -> float | None:
        return dict(self.fast).get(p)

    def as_dict(self) -> dict[str, Any]:
        """The columns in order, fast_p as one column per threshold (`fast_1.5`)."""
        out = super().as_dict()
        del out["fast"]
        out.update({_fast_column(p): self.fast_p(p) for p in FAST_P})
        return out

    def to_csv(self) -> dict[str, Any]:
        return {k: "" if v is None else v for k, v in self.as_dict().items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaderboardRow:
        """The row from its dict (a model of leaderboard.json)."""
        kw = {f.name: data[f.name] for f in fields(cls) if f.name != "fast"}
        return cls(**kw, fast=tuple((p, data[_fast_column(p)]) for p in FAST_P))

    @classmethod
    def from_csv(cls, raw: Mapping[str, str]) -> LeaderboardRow:
        """The row from a row of leaderboard.csv, its types restored ("" is None but for text)."""
        return cls.from_dict({k: _READERS[kind](raw[k]) if raw[k] != "" or kind == "str"
                              else None for k, kind in _column_types().items()})


def _column_types() -> dict[str, str]:
    """Each column of leaderboard.csv: the name of the type it holds (not None)."""
    out = {f.name: str(f.type).split(" | ")[0] for f in fields(LeaderboardRow)}
    del out["fast"]
    return {**out, **{_fast_column(p): "float" for p in FAST_P}}


#: the columns of leaderboard.csv and of each model in leaderboard.json, in order
COLUMNS = tuple(_column_types())
INTS = {k for k, kind in _column_types().items() if kind == "int"}
FLOATS = {k for k, kind in _column_types().items() if kind == "float"}


@dataclass(frozen=True, eq=False)
class CostRow(Row):
    """Table 4's row of an entry that spent money, against the baseline entry."""

    label: str
    refine_rounds: int | None
    budget_usd: float | None
    price: float | None
    pass_rate: float | None
    pass_x_gm: float | None
    baseline: str | None  # the baseline entry's label
    spend_ratio: float | None  # its price over the baseline's
    pass_x_gm_gain: float | None  # its Pass x GM less the baseline's


@dataclass(frozen=True, eq=False)
class AgentRow(Row):
    """Table 5's row of an entry of a model run both in agent mode and by direct prompting."""

    label: str
    mode: str  # "direct", or "agent <its configuration>"
    refine_rounds: int | None
    tasks: int
    passes: int
    pass_rate: float | None
    gm_speedup: float | None
    pass_x_gm: float | None
    price: float | None
    calls: float | None  # model calls per item
    baseline: str  # the best-ranked direct entry of the model
    pass_x_gm_gain: float | None  # its Pass x GM less the baseline's
