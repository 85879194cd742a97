"""The leaderboard's figures as PNGs (matplotlib, the `plots` extra; importing this module
without it raises ImportError, and the report falls back to text bars).

    fig1-pass-rate-by-difficulty.png            grouped bars, one bar per model
    fig2-performance-bands.png                  stacked bars: passing tasks by band
    fig3-pass-rate-by-category-and-library.png  grouped bars, category then library
    speedup-<category>-<task>.png               speedup against size, a line per model and np
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402

from .report import model_colours  # noqa: E402
from .scoring import BAND_ORDER, wilson  # noqa: E402

BAND_COLORS = {"Better": "#1a9850", "Comparable": "#91cf60", "Degraded": "#fc8d59",
               "Severely degraded": "#d73027", "inconclusive": "#bdbdbd", "untimed": "#f0f0f0"}
DPI = 100
# fixed metadata: the same board gives the same bytes
META = {"Software": None, "Creation Time": None}


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, metadata=META, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend_right(ax) -> None:
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _grouped(ax, data: dict[str, dict[str, float]], labels: list[str], title: str,
             counts: dict[str, dict[str, tuple[int, int]]] | None = None) -> None:
    """Grouped bars, one colour per model (the same in every figure), each bar with its value
    above it; a zero is drawn as a stub on the axis, so that it is seen, not missing. Given
    the counts behind the bars (passes, tasks), each bar says them and carries its 90% Wilson
    interval."""
    groups = list(data)
    colours = model_colours(labels)
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        xs = [g + (i - (len(labels) - 1) / 2) * width for g in range(len(groups))]
        ys = [100 * data[group][label] if label in data[group] else None for group in groups]
        shown = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if not shown:
            continue
        bars = ax.bar([x for x, _ in shown], [max(y, 0.8) for _, y in shown], width,
                      label=label, color=colours[label])
        got = [(counts or {}).get(g, {}).get(label) for g, y in zip(groups, ys) if y is not None]
        if counts and all(got):
            ivs = [wilson(p, n) for p, n in got]
            ax.errorbar([x for x, _ in shown], [y for _, y in shown],
                        yerr=[[max(0.0, y - 100 * iv[0]) for (_, y), iv in zip(shown, ivs)],
                              [max(0.0, 100 * iv[1] - y) for (_, y), iv in zip(shown, ivs)]],
                        fmt="none", ecolor="#333", elinewidth=0.7, capsize=1.5)
        if len(labels) * len(groups) <= 40:
            texts = ([f"{p}/{n}" for p, n in got] if counts and all(got)
                     else [f"{y:.0f}" for _, y in shown])
            ax.bar_label(bars, labels=texts, fontsize=5.5, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30 if len(groups) > 4 else 0, ha="right"
                       if len(groups) > 4 else "center")
    ax.set_ylabel("pass rate (%)")
    ax.set_ylim(0, 110)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def draw(labels: list[str], figures: list[tuple[str, str, dict[str, dict[str, float]], bool]],
         speedups: list[tuple[str, str, list[dict[str, Any]]]], out: Path,
         counts: dict[str, dict[str, dict[str, tuple[int, int]]]] | None = None) -> list[Path]:
    """Every figure of a leaderboard into `out`; the paths written. Its numbers are handed
    over (`leaderboard.write` draws through this module, which imports nothing back): the
    entries' `labels`, Figures 1-3 as `leaderboard.figure_data` gives them, and per task
    its speedup-by-size series (file stem, task, series)."""
    written = []
    for stem, title, data, _ in figures:
        if stem.startswith("fig2"):
            fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(labels)))
            left = [0.0] * len(data)
            names = list(data)
            for band in BAND_ORDER:
                widths = [100 * data[n].get(band, 0.0) for n in names]
                ax.barh(names, widths, left=left, color=BAND_COLORS[band], label=band,
                        edgecolor="white")
                left = [a + b for a, b in zip(left, widths)]
            ax.invert_yaxis()
            ax.set_xlim(0, 100)
            ax.set_xlabel("share of passing tasks (%)")
            ax.set_title(title)
            ax.legend(ncol=3, fontsize="small", loc="upper center",
                      bbox_to_anchor=(0.5, -0.12 - 0.6 / (1 + len(labels))))
        elif stem.startswith("fig3"):
            cats = {k[len("category "):]: v for k, v in data.items() if k.startswith("category ")}
            libs = {k[len("library "):]: v for k, v in data.items() if k.startswith("library ")}
            fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
            mine = (counts or {}).get(stem, {})
            _grouped(axes[0], cats, labels, "by category",
                     {k[len("category "):]: v for k, v in mine.items() if k.startswith("category ")})
            _grouped(axes[1], libs, labels, "by library",
                     {k[len("library "):]: v for k, v in mine.items() if k.startswith("library ")})
            handles, names = axes[0].get_legend_handles_labels()
            fig.legend(handles, names, fontsize="small", loc="upper center",
                       ncol=min(len(names), 3), bbox_to_anchor=(0.5, 0.0))
            fig.suptitle(title)
            fig.tight_layout()
        else:
            fig, ax = plt.subplots(figsize=(7, 4))
            _grouped(ax, data, labels, title, (counts or {}).get(stem))
            _legend_right(ax)
        written.append(_save(fig, out / f"{stem}.png"))
    colours = model_colours(labels)
    for stem, task, series in speedups:
        fig, ax = plt.subplots(figsize=(7, 4))
        # bytes per rank where the task counts bytes, else the element count
        by_bytes = all(b > 0 for s in series for b, _, _ in s["points"])
        for k, s in enumerate(series):
            points = sorted(s["points"], key=lambda p: (p[0], p[1]))
            ax.plot([b if by_bytes else c for b, c, _ in points], [v for _, _, v in points],
                    marker="osD^v<>"[k % 7], label=s["series"],
                    color=colours.get(s.get("entry", ""), None))
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        values = [v for s in series for _, _, v in s["points"]]
        # an axis that shows 1.0 and some room around it, not a magnified sliver of one size
        ax.set_ylim(min(0.0, min(values)), max(1.5, 1.1 * max(values)))
        xs = [b if by_bytes else c for s in series for b, c, _ in s["points"]]
        if all(x > 0 for x in xs) and max(xs) > 4 * min(xs):
            ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank" if by_bytes else "count")
        ax.set_ylabel("speedup over the reference")
        ax.set_title(f"speedup by size: {task}")
        ax.grid(alpha=0.3)
        _legend_right(ax)
        written.append(_save(fig, out / f"{stem}.png"))
    return written
