"""Figures 1-3 as numbers (`figure_data`: what `figures` draws as PNGs) and as text bars
(`text_figures`: the terminal's, and report.md's without matplotlib)."""

from __future__ import annotations

from ..report import _pct
from ..scoring import BAND_ORDER, UNTIMED
from .aggregates import RATE_FIGURES, bands, pass_rate_by, rate_values
from .board import Board


def figure_data(board: Board) -> list[tuple[str, str, dict[str, dict[str, float]], bool]]:
    """(file stem, title, {group: {entry: value}}, as percent) of Figures 1-3."""
    out = []
    for stem, title, keys in RATE_FIGURES:
        data: dict[str, dict[str, float]] = {}
        for key in keys:
            rates = pass_rate_by(board, key)
            for value in rate_values(board, key):
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

