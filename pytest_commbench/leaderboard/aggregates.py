"""The numbers behind each table and figure of the report, from a board: Table 1's
composition, Table 2's rows, the pass rates and counts of Figures 1 and 3, Figure 2's bands,
Table 3's rounds and pass@k, Table 4's cost-matched and Table 5's agent comparison, Table 6's
outcomes, and each task's speedup by size."""

from __future__ import annotations

from typing import Any

from ..scoring import (
    BAND_ORDER,
    OUTCOMES,
    UNTIMED,
    breakdown,
    outcomes,
    pass_at_ks,
    passes_by_round,
    record_band,
)
from .board import Board, Entry
from .rows import METRICS, AgentRow, CostRow, LeaderboardRow

DIMENSIONS = ("category", "difficulty", "setup", "library")
DIFFICULTIES = ("easy", "medium", "hard")
SETUPS = ("bare-metal", "library-based")


def composition(board: Board, dimension: str) -> list[dict]:
    """Table 1 by one dimension: per value, the tasks, their share of the suite and how they
    split by difficulty and by setup; a total row last. Given the suite (`Board.suite`), its
    tasks are counted, and `run` says how many of them the logs have results of."""
    ran = board.tasks
    tasks = board.suite if board.suite is not None else list(ran.values())
    total = len(tasks)
    values = sorted({str(t.of(dimension)) for t in tasks})
    rows = []
    for value in [*values, "total"]:
        mine = tasks if value == "total" else [t for t in tasks
                                              if str(t.of(dimension)) == value]
        row = {dimension: value, "tasks": len(mine),
               "share": len(mine) / total if total else None}
        if board.suite is not None:
            row["run"] = sum(1 for t in mine if t.task in ran)
        for key, options in (("difficulty", DIFFICULTIES), ("setup", SETUPS)):
            if key != dimension:
                for o in options:
                    row[o] = sum(1 for t in mine if t.of(key) == o)
        rows.append(row)
    return rows


def leaderboard_rows(board: Board) -> list[LeaderboardRow]:
    """Table 2, a row per entry with every column of leaderboard.csv / .json."""
    rows = []
    for e in board.entries:
        s, iv = e.scores, e.intervals
        metrics: dict[str, Any] = {}
        for metric in METRICS:
            metrics[metric] = getattr(s, metric)
            metrics[f"{metric}_lo"], metrics[f"{metric}_hi"] = getattr(iv, metric) or (None, None)
        rows.append(LeaderboardRow(
            rank=e.rank, tier=e.tier, model=e.model, label=e.label, tasks=s.applicable,
            passes=s.passes, good=s.good, not_applicable=s.not_applicable, **metrics,
            open_weights=e.open_weights, price=e.price, paper_price=e.paper_price,
            refine_rounds=e.refine_rounds, budget_usd=e.budget_usd, runs=" ".join(e.runs),
            fast=tuple(s.fast)))
    return rows


#: the figures of pass rates: (file stem, title, the record fields they group by)
RATE_FIGURES = (
    ("fig1-pass-rate-by-difficulty", "Figure 1: pass rate by difficulty", ("difficulty",)),
    ("fig3-pass-rate-by-category-and-library", "Figure 3: pass rate by category and by library",
     ("category", "library")),
)


def passes_by(board: Board, key: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per entry, (passes, applicable tasks) of each value of `key`: the counts behind a
    figure's bars."""
    return {e.label: {value: (s.passes, s.applicable) for value, s in breakdown(e.solutions, key)
                      if s.applicable} for e in board.entries}


def figure_counts(board: Board) -> dict[str, dict[str, dict[str, tuple[int, int]]]]:
    """Per figure of pass rates (its file stem), per group and entry: (passes, tasks)."""
    out = {}
    for stem, _title, keys in RATE_FIGURES:
        groups: dict[str, dict[str, tuple[int, int]]] = {}
        for key in keys:
            for label, by in passes_by(board, key).items():
                for value, counts in by.items():
                    group = f"{key} {value}" if len(keys) > 1 else value
                    groups.setdefault(group, {})[label] = counts
        out[stem] = groups
    return out


def pass_rate_by(board: Board, key: str) -> dict[str, dict[str, float | None]]:
    """Figures 1 and 3: per entry, the pass rate of each value of `key` (difficulty, category,
    library)."""
    return {e.label: {value: s.pass_rate for value, s in breakdown(e.solutions, key)
                      if s.applicable} for e in board.entries}


def rate_values(board: Board, key: str) -> list[str]:
    """The values of `key` any entry has a pass rate of: difficulties in their order, then
    the rest sorted."""
    seen = {v for rates in pass_rate_by(board, key).values() for v in rates}
    order = DIFFICULTIES if key == "difficulty" else ()
    return [v for v in order if v in seen] + sorted(seen - set(order))


def bands(board: Board) -> dict[str, dict[str, int]]:
    """Figure 2: per entry, its passing tasks counted by performance band (a pass without a
    speedup is `untimed`)."""
    out = {}
    for e in board.entries:
        counts = dict.fromkeys(BAND_ORDER, 0)
        for t in e.tasks:
            if t.passed:
                counts[record_band(t) or UNTIMED] += 1
        out[e.label] = counts
    return out


def rounds(board: Board) -> dict[str, list[tuple[int, int]]]:
    """Table 3: per entry that refined, the cumulative task passes after each round."""
    return {e.label: by for e in board.entries if (by := passes_by_round(e.solutions))}


def pass_at_k(board: Board) -> dict[str, list[tuple[int, float]]]:
    """Table 3 (samples): per entry with several samples per task, pass@k for every k."""
    return {e.label: ks for e in board.entries if (ks := pass_at_ks(e.solutions))}


def cost_matched(board: Board) -> list[CostRow]:
    """Table 4: entries that spent money, by spend, against the baseline (the best-ranked
    single-round entry with a price): the paper's comparison of a strong model's one round
    with others given more rounds for about the same spend. Empty unless a run had a budget."""
    priced = [e for e in board.entries if e.price is not None]
    if not any(e.budget_usd is not None for e in priced):
        return []
    single = [e for e in priced if (e.refine_rounds or 1) == 1 and e.budget_usd is None]
    base = single[0] if single else None
    rows = []
    for e in sorted(priced, key=lambda e: (e.price, e.label)):
        rows.append(CostRow(
            label=e.label, refine_rounds=e.refine_rounds, budget_usd=e.budget_usd,
            price=e.price, pass_rate=e.scores.pass_rate, pass_x_gm=e.scores.pass_x_gm,
            baseline=base.label if base else None,
            spend_ratio=e.price / base.price if base and base.price else None,
            pass_x_gm_gain=_gain(e, base) if base else None))
    return rows


def _gain(e: Entry, base: Entry) -> float | None:
    """An entry's Pass x GM less the baseline's, where both have one."""
    if e.scores.pass_x_gm is None or base.scores.pass_x_gm is None:
        return None
    return e.scores.pass_x_gm - base.scores.pass_x_gm


def agent_vs_direct(board: Board) -> list[AgentRow]:
    """Table 5: for every model run both in agent mode and by direct prompting, each of its
    entries with its scores, spend and model calls per task, and Pass x GM against the best
    direct entry of the model (GEAK's comparison). Empty unless a model ran both ways."""
    rows = []
    for model in sorted({e.model for e in board.entries}):
        mine = [e for e in board.entries if e.model == model]
        direct = [e for e in mine if e.agent is None]
        if not direct or len(direct) == len(mine):
            continue
        base = direct[0]  # the best-ranked direct entry
        for e in sorted(mine, key=lambda e: (e.agent is not None, e.agent or "", e.label)):
            calls = [sum(((r.result.agent and r.result.agent.calls) or {}).values())
                     if r.item.agent else int(r.result.rounds or 1) for r in e.solutions]
            rows.append(AgentRow(
                label=e.label, mode=f"agent {e.agent}" if e.agent else "direct",
                refine_rounds=e.refine_rounds, tasks=e.scores.applicable,
                passes=e.scores.passes, pass_rate=e.scores.pass_rate,
                gm_speedup=e.scores.gm_speedup, pass_x_gm=e.scores.pass_x_gm, price=e.price,
                calls=sum(calls) / len(calls) if calls else None, baseline=base.label,
                pass_x_gm_gain=_gain(e, base)))
    return rows


def speedups_by_size(board: Board) -> dict[str, list[dict[str, Any]]]:
    """Per task: one series per entry and world size that passed, the speedup at each size
    (bytes per rank, as the task counts them)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in board.entries:
        for r in sorted(e.solutions, key=lambda r: (r.item.world or 0, r.item.candidate)):
            points = [(s.bytes, s.count, s.speedup) for s in r.result.sizes
                      if s.speedup is not None and s.bytes is not None]
            if not r.passed or not points:
                continue
            name = e.label + (f" np{r.item.world}" if r.item.world is not None else "") \
                + (f" {r.item.candidate}" if r.item.candidate else "")
            out.setdefault(r.item.task or "?", []).append({"series": name, "points": points,
                                                           "entry": e.label})
    return dict(sorted(out.items()))



def anatomy_columns(entries: list[Entry]) -> list[str]:
    """The outcomes any of these entries had, in OUTCOMES order."""
    counts = [outcomes(e.solutions) for e in entries]
    extra = sorted({o for c in counts for o in c} - set(OUTCOMES))
    return [o for o in (*OUTCOMES, *extra) if any(c.get(o) for c in counts)]

