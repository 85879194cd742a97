"""The board: an entry per model and configuration, each with its scores and their bootstrap
intervals, ranked by Pass x GM and split into tiers where adjacent intervals separate
(`build`), and the suite's tasks where the report was given the suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..record import Identity, ResultLine, as_lines
from ..results import merge
from ..scoring import Intervals, Records, Scores, bootstrap, per_task, score
from .grouping import check_one_fingerprint, entry_key


@dataclass
class Entry:
    label: str  # the model, with its settings where the model ran in several
    model: str
    records: list[ResultLine]  # every record of the entry (solutions and mutants), one per item
    scores: Scores
    intervals: Intervals
    open_weights: bool | None = None
    paper_price: float | None = None
    refine_rounds: int | None = None
    budget_usd: float | None = None
    agent: str | None = None  # agent mode's configuration (None: direct prompting)
    rank: int | None = 0  # None: not ranked (no task judged)
    tier: int | None = 0

    @property
    def solutions(self) -> list[ResultLine]:
        return [r for r in self.records if r.is_solution]

    @property
    def tasks(self) -> list[ResultLine]:
        """One record per task (and sample): what the scores count."""
        return per_task(self.solutions)

    @property
    def runs(self) -> list[str]:
        return sorted({str(r.item.run) for r in self.records if r.item.run})

    @property
    def price(self) -> float | None:
        """Mean cost per applicable task; None where no answer's cost is known (no prices)."""
        return self.scores.price


@dataclass
class Board:
    entries: list[Entry]  # ranked by Pass x GM
    fingerprint: dict
    # runs of no solution (`mutants`: the checker's test, not a model's): shown, never ranked
    unranked: list[Entry] = field(default_factory=list)
    # the suite's tasks for this platform (each its identity's task facts), where the report
    # was given the suite: Table 1 counts them, not what the logs happen to hold
    suite: list[Identity] | None = None

    @property
    def tasks(self) -> dict[str, Identity]:
        """Every task of the suite that any entry ran, by name (its first record's)."""
        out: dict[str, Identity] = {}
        for e in self.entries:
            for r in e.solutions:
                out.setdefault(r.item.task or r.item.nodeid, r.item)
        return dict(sorted(out.items()))


#: a task of the suite, for Table 1: its facts and the platforms it runs on
SuiteTask = tuple[Identity, tuple[str, ...]]


def _config_label(model: str, rounds: int | None, budget: float | None,
                  agent: str | None = None) -> str:
    parts = ["rounds unknown" if rounds is None else f"{rounds} round{'s' * (rounds != 1)}"]
    if budget is not None:
        parts.append(f"${budget:.2f}/task budget")
    if agent is not None:
        parts.insert(0, f"agent {agent}")
    return f"{model} ({', '.join(parts)})"


def _registry(models_file: Path | None) -> dict:
    from ..models.registry import RegistryError, load

    try:
        return load(models_file)
    except RegistryError:
        if models_file is not None:
            raise
        return {}


def _bounds(e: Entry) -> list[float] | None:
    """The Pass x GM interval that ranks an entry (a model passing nothing scores 0)."""
    if e.intervals.pass_x_gm is not None:
        return e.intervals.pass_x_gm
    return [0.0, 0.0] if e.scores.applicable and not e.scores.passes else None


def separated(upper: Entry, lower: Entry) -> bool:
    """Whether two entries are told apart: their Pass x GM intervals do not overlap."""
    a, b = _bounds(upper), _bounds(lower)
    return a is not None and b is not None and a[0] > b[1]


def build(records: Records, models_file: Path | None = None,
          resamples: int | None = None, suite: list[SuiteTask] | None = None) -> Board:
    """The board of records of one fingerprint (FingerprintMismatch otherwise): an entry per
    model and configuration, each item once (the later record wins), ranked by Pass x GM
    (then Pass Rate), tiers split where adjacent intervals separate."""
    records = as_lines(records)
    fp = check_one_fingerprint(records)
    specs = _registry(models_file)
    by_model: dict[str, dict[tuple, list[ResultLine]]] = {}
    for r in records:
        by_model.setdefault(str(r.item.model or "?"), {}).setdefault(entry_key(r), []).append(r)
    entries = []
    for model, configs in by_model.items():
        for (rounds, budget, agent, run_label, hints), recs in configs.items():
            # runs labelled by the caller stay apart: the label names the entry
            same = [c for c in configs if c[3] == run_label]
            label = model if len(same) == 1 else _config_label(model, rounds, budget, agent)
            if hints:  # prompts with the tasks' hints: never the same entry as without
                label = f"{label} +hints"
            if run_label:
                label = f"{label} [{run_label}]"
            recs = merge(recs)
            spec = specs.get(model)
            kw = {} if resamples is None else {"resamples": resamples}
            entries.append(Entry(
                label=label, model=model, records=recs, scores=score(recs),
                intervals=bootstrap(recs, **kw),
                open_weights=getattr(spec, "open_weights", None),
                paper_price=getattr(spec, "paper_price", None),
                refine_rounds=rounds, budget_usd=budget, agent=agent))
    unranked = [e for e in entries if not e.solutions]
    entries = [e for e in entries if e.solutions]
    # a model of no judged task (every item skipped or an infra error) is listed, last,
    # and never ranked: a Pass Rate of nothing is no 0% and no tier
    entries.sort(key=lambda e: (not e.scores.applicable, e.scores.pass_x_gm is None,
                                -(e.scores.pass_x_gm or 0), -(e.scores.pass_rate or 0),
                                e.label))
    ranked = [e for e in entries if e.scores.applicable]
    tier = 1
    for i, e in enumerate(ranked):
        if i and separated(ranked[i - 1], e):
            tier += 1
        e.rank, e.tier = i + 1, tier
    for e in entries[len(ranked):]:
        e.rank = e.tier = None
    tasks = None if suite is None else [
        t for t, platforms in suite if not fp.get("platform") or fp["platform"] in platforms]
    return Board(entries, fp, unranked, tasks)

