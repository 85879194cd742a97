"""The report's files: report.md (`markdown`), leaderboard.csv (`write_csv`, read back by
`read_csv`), leaderboard.json (`to_json`) and, with matplotlib, a PNG per figure through
`figures`; `write` writes them all. `leaderboard_markdown` is Table 2 for a README."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tabulate import tabulate

from ..report import _num
from .aggregates import (
    DIMENSIONS,
    agent_vs_direct,
    bands,
    composition,
    cost_matched,
    figure_counts,
    leaderboard_rows,
    pass_at_k,
    pass_rate_by,
    rounds,
    speedups_by_size,
)
from .board import Board
from .charts import figure_data, text_figures
from .grouping import fingerprint_line
from .rows import COLUMNS, LeaderboardRow
from .text import tables

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
            w.writerow(row.to_csv())


def read_csv(path: Path) -> list[LeaderboardRow]:
    """leaderboard.csv back as the rows `leaderboard_rows` gave (types restored)."""
    with open(path, newline="") as f:
        return [LeaderboardRow.from_csv(raw) for raw in csv.DictReader(f)]


def to_json(board: Board) -> dict[str, Any]:
    iv = board.entries[0].intervals if board.entries else None
    return {
        "fingerprint": board.fingerprint,
        "ranking": "pass_x_gm",
        "bootstrap": None if iv is None else {"resamples": iv.resamples, "seed": iv.seed,
                                              "level": iv.level, "over": "tasks"},
        "models": [r.as_dict() for r in leaderboard_rows(board)],
        "composition": {dim: composition(board, dim) for dim in DIMENSIONS},
        "pass_rate_by": {key: pass_rate_by(board, key) for key in
                         ("difficulty", "category", "library")},
        "bands": bands(board),
        "rounds": {k: [list(x) for x in v] for k, v in rounds(board).items()},
        "pass_at_k": {k: [list(x) for x in v] for k, v in pass_at_k(board).items()},
        "cost_matched": [r.as_dict() for r in cost_matched(board)],
        **({"agent_vs_direct": [r.as_dict() for r in versus]}
           if (versus := agent_vs_direct(board)) else {}),
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
        from ..figures import draw
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

