"""The report's tables as text (`tables`: every table, its cells formatted), and the whole
report for the terminal (`render`); `render_run` is one run as the pytest summary shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from .. import report
from ..report import WriteLine, WriteSep, _num, _pct
from ..scoring import FAST_P, Records, outcomes
from .aggregates import (
    agent_vs_direct,
    anatomy_columns,
    composition,
    cost_matched,
    leaderboard_rows,
    pass_at_k,
    rounds,
)
from .board import Board
from .charts import text_figures
from .grouping import fingerprint_line


def _with(x: float | None, iv: list[float] | None, pct: bool) -> str:
    f = _pct if pct else _num
    if x is None:
        return "-"
    return f(x) + (f" [{f(iv[0])}, {f(iv[1])}]" if iv else "")


def _gain(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


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
        [[_dash(r.rank), _dash(r.tier), r.label,
          _with(r.pass_x_gm, r.interval("pass_x_gm"), False),
          _with(r.pass_rate, r.interval("pass_rate"), True),
          _with(r.pass_good, r.interval("pass_good"), True),
          _with(r.gm_speedup, r.interval("gm_speedup"), False),
          f"{r.passes}/{r.tasks}", _yes(r.open_weights), _money(r.price)]
         for r in leaderboard_rows(board)],
        note=_tiers_note(board)))
    out.append(Table(
        "Table 2b: fast_p (share of the tasks that pass with a speedup above p)",
        ["model", "tasks", *(f"fast_{p:g}" for p in FAST_P)],
        [[r.label, r.tasks, *(_pct(r.fast_p(p)) for p in FAST_P)]
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
        base = matched[0].baseline
        out.append(Table(
            "Table 4: cost-matched comparison (mean spend per task)",
            ["model", "rounds", "budget", "$/task", f"spend vs {base}" if base else "spend",
             "Pass Rate", "Pass x GM", f"Pass x GM vs {base}" if base else "gain"],
            [[r.label, r.refine_rounds or "-",
              "-" if r.budget_usd is None else f"${r.budget_usd:g}", _money(r.price),
              "-" if r.spend_ratio is None else f"{r.spend_ratio:.2f}x",
              _pct(r.pass_rate), _num(r.pass_x_gm), _gain(r.pass_x_gm_gain)]
             for r in matched]))
    versus = agent_vs_direct(board)
    if versus:
        out.append(Table(
            "Table 5: agent mode against direct prompting (the same model)",
            ["model", "mode", "rounds", "Pass Rate", "GM-Speedup", "Pass x GM",
             "Pass x GM vs direct", "model calls/item", "$/task"],
            [[r.label, r.mode, r.refine_rounds or "-",
              f"{_pct(r.pass_rate)} ({r.passes}/{r.tasks})", _num(r.gm_speedup),
              _num(r.pass_x_gm), _gain(r.pass_x_gm_gain), _num(r.calls, 1), _money(r.price)]
             for r in versus]))
    shown = anatomy_columns(board.entries)
    if shown:
        out.append(Table(
            "Table 6: failure anatomy (items by how they ended)", ["model", "items", *shown],
            [[e.label, len(e.solutions), *(outcomes(e.solutions).get(o, 0) for o in shown)]
             for e in board.entries]))
    return out



def _tiers_note(board: Board) -> str:
    if not board.entries:
        return ""
    iv = board.entries[0].intervals
    return (f"[lo, hi]: {iv.level:.0%} intervals over tasks ({iv.resamples} bootstrap draws, "
            f"seed {iv.seed}). Models of one tier are not told apart: a tier ends only where "
            "the Pass x GM intervals of adjacent models separate.")



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

