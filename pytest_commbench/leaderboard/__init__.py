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
numbers; the pytest terminal summary renders its single run with `render_run`.

One module a job, each importing only those above it:

    grouping    which records are pooled: fingerprint groups, task versions, entries' keys
    board       the entries, scored, ranked and tiered (`build`)
    rows        the typed rows of Tables 2, 4 and 5, and their dict/CSV form
    aggregates  the numbers of each table and figure
    charts      Figures 1-3 as numbers and as text bars
    text        the tables as text, and the terminal's report
    files       report.md, leaderboard.csv, leaderboard.json and the PNGs

Every name is importable from here."""

from __future__ import annotations

from .aggregates import (
    DIFFICULTIES,
    DIMENSIONS,
    RATE_FIGURES,
    SETUPS,
    agent_vs_direct,
    anatomy_columns,
    bands,
    composition,
    cost_matched,
    figure_counts,
    leaderboard_rows,
    pass_at_k,
    pass_rate_by,
    passes_by,
    rate_values,
    rounds,
    speedups_by_size,
)
from .board import Board, Entry, SuiteTask, build, separated
from .charts import BAND_MARKS, BAR, figure_data, text_figures
from .files import (
    README_SECTION,
    leaderboard_markdown,
    markdown,
    read_csv,
    speedup_stem,
    to_json,
    write,
    write_csv,
)
from .grouping import (
    FingerprintMismatch,
    changed_tasks,
    check_one_fingerprint,
    describe_changed,
    difference,
    entry_key,
    fingerprint_label,
    fingerprint_line,
    fingerprints,
    runs_judging_the_same_items,
    split,
    split_changed,
)
from .rows import COLUMNS, FLOATS, INTS, METRICS, AgentRow, CostRow, LeaderboardRow, Row
from .text import Table, render, render_run, tables

__all__ = [
    "BAND_MARKS", "BAR", "COLUMNS", "DIFFICULTIES", "DIMENSIONS", "FLOATS", "INTS", "METRICS",
    "RATE_FIGURES", "README_SECTION", "SETUPS", "AgentRow", "Board", "CostRow", "Entry",
    "FingerprintMismatch", "LeaderboardRow", "Row", "SuiteTask", "Table", "agent_vs_direct",
    "anatomy_columns", "bands", "build", "changed_tasks", "check_one_fingerprint",
    "composition", "cost_matched", "describe_changed", "difference", "entry_key",
    "figure_counts", "figure_data", "fingerprint_label", "fingerprint_line", "fingerprints",
    "leaderboard_markdown", "leaderboard_rows", "markdown", "pass_at_k", "pass_rate_by",
    "passes_by", "rate_values", "read_csv", "render", "render_run", "rounds",
    "runs_judging_the_same_items", "separated", "speedup_stem", "speedups_by_size", "split",
    "split_changed", "tables", "text_figures", "to_json", "write", "write_csv",
]
