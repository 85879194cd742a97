"""Leaderboards: the CommBench paper's tables and figures from the results logs of one model or
many, with the uncertainty that tells a real difference from noise.

    Table 1  the suite's composition: tasks by category, difficulty, setup and library
    Table 2  the leaderboard, ranked by Pass x GM (the paper's Quality-Weighted Pass Rate), with
             90% bootstrap intervals over tasks; adjacent models share a tier unless their
             Pass x GM intervals separate
    Figure 1 pass rate by difficulty; Figure 2 performance bands over passing tasks;
    Figure 3 pass rate by category and by library
    Table 3  cumulative passes per refinement round; pass@k for every k run
    Table 4  cost-matched comparison (runs with a budget per task)
    Table 5  agent mode against direct prompting of the same model (GEAK's comparison)
    per-task speedup by size, for every model that passed the task

Scores come from `scoring` alone. Runs whose hardware/software fingerprints differ are never
pooled: `split` groups them, and `check_one_fingerprint` refuses them naming the difference.
A model run with other settings (refinement rounds, a budget, agent mode) is another entry of
its own.
The terminal (`render`: tabulate tables and text bars), `markdown` (report.md) and
`write` (report.md, leaderboard.csv, leaderboard.json, PNGs through `figures`) share the
numbers; the pytest terminal summary renders its single run with `render_run`."""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tabulate import tabulate

from . import report
from .record import Identity, ResultLine, as_lines
from .report import WriteLine, WriteSep
from .results import merge
from .scoring import (
    BAND_ORDER,
    FAST_P,
    OUTCOMES,
    UNTIMED,
    Intervals,
    Records,
    Scores,
    bootstrap,
    breakdown,
    outcomes,
    pass_at_ks,
    passes_by_round,
    per_task,
    record_band,
    score,
)

DIMENSIONS = ("category", "difficulty", "setup", "library")
DIFFICULTIES = ("easy", "medium", "hard")
SETUPS = ("bare-metal", "library-based")
METRICS = ("pass_x_gm", "pass_rate", "pass_good", "gm_speedup")
# the columns of leaderboard.csv and of each model in leaderboard.json, in order
COLUMNS = ("rank", "tier", "model", "label", "tasks", "passes", "good", "not_applicable",
           "pass_x_gm", "pass_x_gm_lo", "pass_x_gm_hi", "pass_rate", "pass_rate_lo",
           "pass_rate_hi", "pass_good", "pass_good_lo", "pass_good_hi", "gm_speedup",
           "gm_speedup_lo", "gm_speedup_hi", "open_weights", "price", "paper_price",
           "refine_rounds", "budget_usd", "runs", *(f"fast_{p:g}" for p in FAST_P))
INTS = {"rank", "tier", "tasks", "passes", "good", "not_applicable", "refine_rounds"}
FLOATS = {c for c in COLUMNS if c.startswith(METRICS + ("fast_",))} | {
    "price", "paper_price", "budget_usd"}


# -- fingerprints ---------------------------------------------------------------------------

class FingerprintMismatch(ValueError):
    """Records of machines or software that differ, given to one report."""


def fingerprints(records: Records) -> list[tuple[dict, list[ResultLine]]]:
    """The records grouped by their hardware/software fingerprint, in order of first sight. A
    record without one (an item that started and never finished) takes its run's."""
    records = as_lines(records)
    by_run: dict[str, dict] = {}
    for r in records:
        if r.fingerprint and r.item.run:
            by_run.setdefault(r.item.run, r.fingerprint)
    groups: dict[str, tuple[dict, list[ResultLine]]] = {}
    for r in records:
        fp = r.fingerprint or by_run.get(r.item.run or "", {}) or {}
        groups.setdefault(json.dumps(fp, sort_keys=True, default=str), (fp, []))[1].append(r)
    return list(groups.values())


def fingerprint_label(fp: dict) -> str:
    """A short name for a fingerprint group: its platform and a hash of the whole."""
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()
    return f"{fp.get('platform', 'unknown')}-{digest[:8]}"


def _who(records: list[ResultLine]) -> str:
    models = sorted({str(r.item.model or "?") for r in records})
    runs = sorted({str(r.item.run) for r in records if r.item.run})
    return (f"model{'s' * (len(models) > 1)} {', '.join(models)}"
            + (f", run{'s' * (len(runs) > 1)} {', '.join(runs)}" if runs else ""))


def difference(groups: list[tuple[dict, list[ResultLine]]]) -> str:
    """What differs between fingerprint groups, field by field, with whose records have
    each value."""
    fields = sorted({k for fp, _ in groups for k in fp}, key=lambda k: (k != "platform", k)) \
        or ["fingerprint"]
    lines = []
    for key in fields:
        values = [fp.get(key, "(not recorded)") if fp else "(no fingerprint)" for fp, _ in groups]
        if len({json.dumps(v, default=str) for v in values}) > 1:
            lines.append(f"  {key}: " + " vs ".join(
                f"{v!r} ({_who(recs)})" if isinstance(v, str) and not v.startswith("(")
                else f"{v} ({_who(recs)})" for v, (_, recs) in zip(values, groups)))
    return "\n".join(lines)


def check_one_fingerprint(records: Records) -> dict:
    """The fingerprint all the records share; FingerprintMismatch naming the differing fields
    where they do not."""
    groups = fingerprints(records)
    if len(groups) > 1:
        raise FingerprintMismatch(
            "these runs were made on different hardware or software, and their results are "
            "not pooled:\n" + difference(groups)
            + "\nreport them separately, or give --by-fingerprint for one report per group")
    return groups[0][0] if groups else {}


def changed_tasks(records: Records) -> dict[str, dict[str, list[str]]]:
    """Tasks whose records carry different task hashes (the task, its reference or its
    oracle changed between the runs): {task: {hash: [runs]}}. Records made before hashes
    were written carry none and are not compared."""
    seen: dict[str, dict[str, set[str]]] = {}
    for r in as_lines(records):
        if r.event == "result" and r.item.task_hash:
            seen.setdefault(r.item.task, {}).setdefault(r.item.task_hash, set()).add(
                str(r.item.run or "?"))
    return {task: {h: sorted(runs) for h, runs in by_hash.items()}
            for task, by_hash in seen.items() if len(by_hash) > 1}


def describe_changed(changed: dict[str, dict[str, list[str]]]) -> str:
    return "\n".join(f"  {task}: " + " vs ".join(f"{h} (run{'s' * (len(runs) > 1)} "
                                                  f"{', '.join(runs)})" for h, runs in hashes.items())
                      for task, hashes in sorted(changed.items()))


def split_changed(records: Records, changed: dict) -> list[ResultLine]:
    """Each version of a changed task as a task of its own (`task@hash`)."""
    def version(r: ResultLine) -> ResultLine:
        tag = f"@{r.item.task_hash[:8]}"
        # the node id too: an item counts once per node id (a run and its rerun)
        return replace(r, item=replace(r.item, task=r.item.task + tag,
                                       nodeid=str(r.item.nodeid) + tag))

    return [version(r) if r.item.task in changed and r.item.task_hash else r
            for r in as_lines(records)]


def runs_judging_the_same_items(records: Records) -> list[str]:
    """A line per pair of runs that would make one entry (one model, configuration and label)
    and judged an item both: pooled, the later record of each item would silently replace
    the other's. Runs of disjoint items (a suite run in parts) pool; records naming no run
    (older logs) are not compared."""
    items: dict[tuple, dict[str, set[str]]] = {}
    for r in as_lines(records):
        if r.item.run:
            key = (str(r.item.model or "?"), *_config(r))
            item = f"{r.item.nodeid} {r.item.candidate or ''}".strip()
            items.setdefault(key, {}).setdefault(str(r.item.run), set()).add(item)
    lines = []
    for key, by_run in items.items():
        names = sorted(by_run)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                shared = by_run[a] & by_run[b]
                if shared:
                    label = f" [{key[4]}]" if key[4] else ""
                    lines.append(f"  model {key[0]}{label}: runs {a} and {b} both judged "
                                 f"{len(shared)} item{'s' * (len(shared) > 1)} (e.g. "
                                 f"{min(shared)})")
    return lines


def split(records: Records) -> list[tuple[str, dict, list[ResultLine]]]:
    """(label, fingerprint, records) per fingerprint group."""
    return [(fingerprint_label(fp), fp, recs) for fp, recs in fingerprints(records)]


# -- entries: one model in one configuration --------------------------------------------------

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


def _config(r: ResultLine) -> tuple:
    return (r.item.refine_rounds, r.item.budget_usd, r.item.agent, r.run_label,
            bool(r.item.hints))


def _config_label(model: str, rounds: int | None, budget: float | None,
                  agent: str | None = None) -> str:
    parts = ["rounds unknown" if rounds is None else f"{rounds} round{'s' * (rounds != 1)}"]
    if budget is not None:
        parts.append(f"${budget:.2f}/task budget")
    if agent is not None:
        parts.insert(0, f"agent {agent}")
    return f"{model} ({', '.join(parts)})"


def _registry(models_file: Path | None) -> dict:
    from .models.registry import RegistryError, load

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
        by_model.setdefault(str(r.item.model or "?"), {}).setdefault(_config(r), []).append(r)
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


# -- the numbers of each table and figure -----------------------------------------------------

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


def leaderboard_rows(board: Board) -> list[dict[str, Any]]:
    """Table 2, one dict per entry with every column of leaderboard.csv / .json."""
    rows = []
    for e in board.entries:
        s, iv = e.scores, e.intervals
        row: dict[str, Any] = {
            "rank": e.rank, "tier": e.tier, "model": e.model, "label": e.label,
            "tasks": s.applicable, "passes": s.passes, "good": s.good,
            "not_applicable": s.not_applicable}
        for metric in METRICS:
            interval = getattr(iv, metric)
            row[metric] = getattr(s, metric)
            row[f"{metric}_lo"], row[f"{metric}_hi"] = interval or (None, None)
        row.update(open_weights=e.open_weights, price=e.price, paper_price=e.paper_price,
                   refine_rounds=e.refine_rounds, budget_usd=e.budget_usd,
                   runs=" ".join(e.runs))
        row.update({f"fast_{p:g}": v for p, v in s.fast})
        rows.append(row)
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


def _values(board: Board, key: str) -> list[str]:
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


def cost_matched(board: Board) -> list[dict[str, Any]]:
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
        rows.append({
            "label": e.label, "refine_rounds": e.refine_rounds, "budget_usd": e.budget_usd,
            "price": e.price, "pass_rate": e.scores.pass_rate, "pass_x_gm": e.scores.pass_x_gm,
            "baseline": base.label if base else None,
            "spend_ratio": e.price / base.price if base and base.price else None,
            "pass_x_gm_gain": (e.scores.pass_x_gm - base.scores.pass_x_gm)
            if base and e.scores.pass_x_gm is not None and base.scores.pass_x_gm is not None
            else None})
    return rows


def agent_vs_direct(board: Board) -> list[dict[str, Any]]:
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
            gain = (e.scores.pass_x_gm - base.scores.pass_x_gm
                    if e.scores.pass_x_gm is not None and base.scores.pass_x_gm is not None
                    else None)
            rows.append({"label": e.label, "mode": f"agent {e.agent}" if e.agent else "direct",
                         "refine_rounds": e.refine_rounds, "tasks": e.scores.applicable,
                         "passes": e.scores.passes, "pass_rate": e.scores.pass_rate,
                         "gm_speedup": e.scores.gm_speedup, "pass_x_gm": e.scores.pass_x_gm,
                         "price": e.price, "calls": sum(calls) / len(calls) if calls else None,
                         "baseline": base.label, "pass_x_gm_gain": gain})
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


# -- text ------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _with(x: float | None, iv: list[float] | None, pct: bool) -> str:
    f = _pct if pct else _num
    if x is None:
        return "-"
    return f(x) + (f" [{f(iv[0])}, {f(iv[1])}]" if iv else "")


def _dash(x: Any) -> Any:
    return "-" if x is None else x


def _yes(x: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[x]


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:.4f}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Any]]
    note: str = ""


def tables(board: Board) -> list[Table]:
    """Every table of the report, its cells as text."""
    out = []
    for dim in ("category", "library"):
        rows = composition(board, dim)
        extra = [k for k in rows[0] if k not in (dim, "tasks", "share")] if rows else []
        source = (f"the suite's tasks for {board.fingerprint.get('platform', 'this platform')}"
                  "; run: those the logs have results of" if board.suite is not None
                  else "the tasks in the logs")
        out.append(Table(
            f"Table 1{'a' if dim == 'category' else 'b'}: the suite by {dim} ({source})",
            [dim, "tasks", "share", *extra],
            [[r[dim], r["tasks"], _pct(r["share"]), *(r[k] for k in extra)] for r in rows]))
    out.append(Table(
        "Table 2: leaderboard (ranked by Pass x GM, the quality-weighted pass rate)",
        ["#", "tier", "model", "Pass x GM", "Pass Rate", "PASS+Good", "GM-Speedup", "tasks",
         "open weights", "$/task"],
        [[_dash(r["rank"]), _dash(r["tier"]), r["label"],
          _with(r["pass_x_gm"], _iv(r, "pass_x_gm"), False),
          _with(r["pass_rate"], _iv(r, "pass_rate"), True),
          _with(r["pass_good"], _iv(r, "pass_good"), True),
          _with(r["gm_speedup"], _iv(r, "gm_speedup"), False),
          f"{r['passes']}/{r['tasks']}", _yes(r["open_weights"]), _money(r["price"])]
         for r in leaderboard_rows(board)],
        note=_tiers_note(board)))
    out.append(Table(
        "Table 2b: fast_p (share of the tasks that pass with a speedup above p)",
        ["model", "tasks", *(f"fast_{p:g}" for p in FAST_P)],
        [[r["label"], r["tasks"], *(_pct(r[f"fast_{p:g}"]) for p in FAST_P)]
         for r in leaderboard_rows(board)]))
    by_round = rounds(board)
    if by_round:
        most = max(n for series in by_round.values() for n, _ in series)
        rows = []
        for e in board.entries:
            if e.label in by_round:
                got = dict(by_round[e.label])
                rows.append([e.label, e.scores.applicable, *(
                    f"{got[n]} ({_pct(got[n] / e.scores.applicable)})"
                    if n in got and e.scores.applicable else "-" for n in range(1, most + 1))])
        out.append(Table("Table 3: tasks passed after each refinement round (cumulative)",
                         ["model", "tasks", *(f"round {n}" for n in range(1, most + 1))], rows))
    ks = pass_at_k(board)
    if ks:
        most = max(k for series in ks.values() for k, _ in series)
        out.append(Table("Table 3b: pass@k over the samples (unbiased estimator)",
                         ["model", *(f"pass@{k}" for k in range(1, most + 1))],
                         [[label, *(_pct(dict(series).get(k)) for k in range(1, most + 1))]
                          for label, series in ks.items()]))
    matched = cost_matched(board)
    if matched:
        base = matched[0]["baseline"]
        out.append(Table(
            "Table 4: cost-matched comparison (mean spend per task)",
            ["model", "rounds", "budget", "$/task", f"spend vs {base}" if base else "spend",
             "Pass Rate", "Pass x GM", f"Pass x GM vs {base}" if base else "gain"],
            [[r["label"], r["refine_rounds"] or "-",
              "-" if r["budget_usd"] is None else f"${r['budget_usd']:g}", _money(r["price"]),
              "-" if r["spend_ratio"] is None else f"{r['spend_ratio']:.2f}x",
              _pct(r["pass_rate"]), _num(r["pass_x_gm"]),
              "-" if r["pass_x_gm_gain"] is None else f"{r['pass_x_gm_gain']:+.3f}"]
             for r in matched]))
    versus = agent_vs_direct(board)
    if versus:
        out.append(Table(
            "Table 5: agent mode against direct prompting (the same model)",
            ["model", "mode", "rounds", "Pass Rate", "GM-Speedup", "Pass x GM",
             "Pass x GM vs direct", "model calls/item", "$/task"],
            [[r["label"], r["mode"], r["refine_rounds"] or "-",
              f"{_pct(r['pass_rate'])} ({r['passes']}/{r['tasks']})", _num(r["gm_speedup"]),
              _num(r["pass_x_gm"]),
              "-" if r["pass_x_gm_gain"] is None else f"{r['pass_x_gm_gain']:+.3f}",
              _num(r["calls"], 1), _money(r["price"])] for r in versus]))
    shown = anatomy_columns(board.entries)
    if shown:
        out.append(Table(
            "Table 6: failure anatomy (items by how they ended)", ["model", "items", *shown],
            [[e.label, len(e.solutions), *(outcomes(e.solutions).get(o, 0) for o in shown)]
             for e in board.entries]))
    return out


def anatomy_columns(entries: list[Entry]) -> list[str]:
    """The outcomes any of these entries had, in OUTCOMES order."""
    counts = [outcomes(e.solutions) for e in entries]
    extra = sorted({o for c in counts for o in c} - set(OUTCOMES))
    return [o for o in (*OUTCOMES, *extra) if any(c.get(o) for c in counts)]


def _iv(row: dict, metric: str) -> list[float] | None:
    lo, hi = row[f"{metric}_lo"], row[f"{metric}_hi"]
    return None if lo is None else [lo, hi]


def _tiers_note(board: Board) -> str:
    if not board.entries:
        return ""
    iv = board.entries[0].intervals
    return (f"[lo, hi]: {iv.level:.0%} intervals over tasks ({iv.resamples} bootstrap draws, "
            f"seed {iv.seed}). Models of one tier are not told apart: a tier ends only where "
            "the Pass x GM intervals of adjacent models separate.")


def figure_data(board: Board) -> list[tuple[str, str, dict[str, dict[str, float]], bool]]:
    """(file stem, title, {group: {entry: value}}, as percent) of Figures 1-3."""
    out = []
    for stem, title, keys in RATE_FIGURES:
        data: dict[str, dict[str, float]] = {}
        for key in keys:
            rates = pass_rate_by(board, key)
            for value in _values(board, key):
                data[f"{key} {value}" if len(keys) > 1 else value] = {
                    label: r[value] for label, r in rates.items()
                    if r.get(value) is not None}
        out.append((stem, title, data, True))
    shares = {}
    for label, counts in bands(board).items():
        total = sum(counts.values())
        shares[label] = {b: n / total for b, n in counts.items() if total}
    out.insert(1, ("fig2-performance-bands", "Figure 2: performance bands over passing tasks",
                   shares, True))
    return out


BAR = 30
BAND_MARKS = {"Better": "B", "Comparable": "C", "Degraded": "D", "Severely degraded": "S",
              "inconclusive": "?", UNTIMED: "u"}


def text_figures(board: Board) -> list[str]:
    """Figures 1-3 as text bars (the terminal's, and report.md's without matplotlib)."""
    lines: list[str] = []
    width = max((len(e.label) for e in board.entries), default=5)
    for stem, title, data, _ in figure_data(board):
        lines += [title, ""]
        if stem.startswith("fig2"):
            for label, shares in data.items():
                counts = bands(board)[label]
                bar = "".join(BAND_MARKS[b] * round(BAR * shares.get(b, 0)) for b in BAND_ORDER)
                lines.append(f"  {label:<{width}}  {bar:<{BAR}}  " + (", ".join(
                    f"{n} {b}" for b, n in counts.items() if n) or "no passes"))
            lines.append("  (" + ", ".join(f"{m} {b}" for b, m in BAND_MARKS.items()) + ")")
        else:
            group_width = max((len(g) for g in data), default=5)
            for group, values in data.items():
                for i, (label, v) in enumerate(values.items()):
                    bar = "#" * round(BAR * v)
                    lines.append(f"  {group if i == 0 else '':<{group_width}}  {label:<{width}}"
                                 f"  {bar:<{BAR}}  {_pct(v)}")
        lines.append("")
    return lines


def _write_table(t: Table, write_line: WriteLine, fmt: str) -> None:
    write_line(t.title)
    write_line("")
    for line in tabulate(t.rows, headers=t.headers, tablefmt=fmt, disable_numparse=True
                         ).splitlines():
        write_line(line)
    if t.note:
        write_line("")
        write_line(t.note)
    write_line("")


def render_run(records: Records, write_line: WriteLine, write_sep: WriteSep,
               header: str = "commbench") -> None:
    """One run (the pytest terminal summary, and each entry of `commbench report`): its items,
    scores with their intervals, breakdowns and mutants."""
    report.render(records, write_line, write_sep, header=header)


def render(board: Board, write_line: WriteLine, write_sep: WriteSep) -> None:
    """The whole report for the terminal: each entry's run as the pytest summary shows it, then
    the tables and the figures as text bars."""
    for e in board.entries + board.unranked:
        render_run(e.records, write_line, write_sep, header=f"commbench: model {e.label}")
        write_line("")
    if not board.entries:
        return
    write_sep("=", "commbench: leaderboard")
    if board.fingerprint:
        write_line(fingerprint_line(board.fingerprint))
        write_line("")
    for t in tables(board):
        _write_table(t, write_line, "simple")
    for line in text_figures(board):
        write_line(line)


def fingerprint_line(fp: dict) -> str:
    return "Hardware and software: " + ", ".join(f"{k} {v}" for k, v in sorted(fp.items()))


# -- files -----------------------------------------------------------------------------------

README_SECTION = "leaderboard"


def leaderboard_markdown(board: Board) -> str:
    """Table 2 as markdown, with the note on intervals and tiers (docs/reports.md's block)."""
    t = next(t for t in tables(board) if t.title.startswith("Table 2"))
    return "\n".join([tabulate(t.rows, headers=t.headers, tablefmt="github",
                               disable_numparse=True), "", t.note])


def markdown(board: Board, images: dict[str, str] | None = None,
             commands: str = "") -> str:
    """report.md: every table, then the figures (images where given, else text bars)."""
    lines = ["# CommBench leaderboard", ""]
    if commands:
        lines += ["Made by:", "", "```", commands, "```", ""]
    if board.fingerprint:
        lines += [fingerprint_line(board.fingerprint) + ".", ""]
    runs = [f"{e.label}: {', '.join(e.runs) or '-'}" for e in board.entries]
    if runs:
        lines += ["Runs: " + "; ".join(runs) + ".", ""]
    for t in tables(board):
        lines += [f"## {t.title}", "", tabulate(t.rows, headers=t.headers, tablefmt="github",
                                                disable_numparse=True), ""]
        if t.note:
            lines += [t.note, ""]
    images = images or {}
    for stem, title, _, _ in figure_data(board):
        lines += [f"## {title}", ""]
        if stem in images:
            lines += [f"![{title}]({images[stem]})", ""]
        else:
            block = text_figures(board)
            start = block.index(title)
            end = block.index("", start + 2)
            lines += ["```", *block[start + 2:end], "```", ""]
    by_size = speedups_by_size(board)
    if by_size:
        lines += ["## Speedup by size, per task", "",
                  "Speedup over the expert reference at each size (bytes per rank) of every "
                  "passing answer.", ""]
        for task, series in by_size.items():
            stem = speedup_stem(task)
            lines += [f"### {task}", ""]
            if stem in images:
                lines += [f"![speedup by size: {task}]({images[stem]})", ""]
            sizes = sorted({(b, c) for s in series for b, c, _ in s["points"]})
            rows = [[f"{b:,}", c, *(next((_num(v) for bb, cc, v in s["points"]
                                          if (bb, cc) == (b, c)), "-") for s in series)]
                    for b, c in sizes]
            lines += [tabulate(rows, headers=["bytes", "count", *(s["series"] for s in series)],
                               tablefmt="github", disable_numparse=True), ""]
    return "\n".join(lines)


def speedup_stem(task: str) -> str:
    return "speedup-" + task.replace("/", "-")


def write_csv(board: Board, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for row in leaderboard_rows(board):
            w.writerow({k: "" if v is None else v for k, v in row.items()})


def read_csv(path: Path) -> list[dict[str, Any]]:
    """leaderboard.csv back as the rows `leaderboard_rows` gave (types restored)."""
    out = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k in COLUMNS:
                v = raw[k]
                if v == "":
                    row[k] = None
                elif k in INTS:
                    row[k] = int(v)
                elif k in FLOATS:
                    row[k] = float(v)
                elif k == "open_weights":
                    row[k] = v == "True"
                else:
                    row[k] = v
            out.append(row)
    return out


def to_json(board: Board) -> dict[str, Any]:
    iv = board.entries[0].intervals if board.entries else None
    return {
        "fingerprint": board.fingerprint,
        "ranking": "pass_x_gm",
        "bootstrap": None if iv is None else {"resamples": iv.resamples, "seed": iv.seed,
                                              "level": iv.level, "over": "tasks"},
        "models": leaderboard_rows(board),
        "composition": {dim: composition(board, dim) for dim in DIMENSIONS},
        "pass_rate_by": {key: pass_rate_by(board, key) for key in
                         ("difficulty", "category", "library")},
        "bands": bands(board),
        "rounds": {k: [list(x) for x in v] for k, v in rounds(board).items()},
        "pass_at_k": {k: [list(x) for x in v] for k, v in pass_at_k(board).items()},
        "cost_matched": cost_matched(board),
        **({"agent_vs_direct": versus} if (versus := agent_vs_direct(board)) else {}),
        "speedups_by_size": {task: [{"series": s["series"], "points": [list(p) for p in
                                                                        s["points"]]}
                                    for s in series]
                             for task, series in speedups_by_size(board).items()},
    }


def write(board: Board, out: Path, commands: str = "") -> list[Path]:
    """report.md, leaderboard.csv, leaderboard.json and (with matplotlib) one PNG per figure
    into `out`; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    images: dict[str, str] = {}
    try:
        from .figures import draw
    except ImportError:  # matplotlib is the `plots` extra
        draw = None
    if draw is not None:
        # figures knows no board: it is handed the numbers (and each speedup figure's stem,
        # which `markdown` finds it by)
        speedups = [(speedup_stem(task), task, series)
                    for task, series in speedups_by_size(board).items()]
        for path in draw([e.label for e in board.entries], figure_data(board), speedups, out,
                         figure_counts(board)):
            images[path.stem] = path.name
            written.append(path)
    (out / "report.md").write_text(markdown(board, images, commands) + "\n")
    write_csv(board, out / "leaderboard.csv")
    (out / "leaderboard.json").write_text(json.dumps(to_json(board), indent=1) + "\n")
    written += [out / "report.md", out / "leaderboard.csv", out / "leaderboard.json"]
    return written

