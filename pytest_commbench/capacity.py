"""Can this machine time the selected items? Said in one line before the first item runs, with
what the run will report and what to run instead, and a warning where pytest-xdist's `-n`
would make timed items share too few CPUs.

The rule is the harness's own (`timing.HostLoad`): while an item is timed every rank keeps a
CPU busy (MPI progress, a spinning device synchronize) and the observer needs one more, so an
item of W ranks needs W + 1 CPUs besides the load from outside it; where that exceeds the CPUs
pytest may run on (`os.sched_getaffinity`, with the same slack) its timing is `contended` and
its speedup is not to be read. Other xdist workers' items are load from outside: with `-n N`,
N items are timed at once. Here the outside load is the 1-minute load average before any item
ran (the harness measures it again while each item is timed)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .timing import CONTENTION_SLACK_CPUS

CHECK_ONLY = "--commbench-check-only"


@dataclass(frozen=True)
class Outlook:
    """What the run can measure: the statement, and a warning about `-n` (None: none)."""

    line: str
    warning: str | None = None


def machine() -> tuple[int, float]:
    """The CPUs this process may run on and the 1-minute load average (0 where unknown)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cpus, load


def fits(ranks: int, at_once: int, cpus: int, load: float) -> bool:
    """Do `at_once` items of `ranks` ranks each, timed side by side, leave each uncontended?"""
    return at_once * (ranks + 1) + load <= cpus + CONTENTION_SLACK_CPUS


def cpus_needed(ranks: int, load: float) -> int:
    """The fewest CPUs on which an item of `ranks` ranks is timed uncontended at this load."""
    return max(1, math.ceil(ranks + 1 + load - CONTENTION_SLACK_CPUS))


def most_workers(ranks: int, cpus: int, load: float) -> int:
    """The most items of `ranks` ranks that can be timed side by side (0: not even one)."""
    return max(0, int((cpus + CONTENTION_SLACK_CPUS - load) // (ranks + 1)))


def outlook(worlds: list[int], workers: int, cpus: int, load: float, check_only: bool = False,
            compile_only: bool = False) -> Outlook | None:
    """The statement for a run whose timed items have these world sizes (one per item), run by
    `workers` xdist workers (1: none); None where there is nothing to say (no item)."""
    if compile_only:
        return Outlook("commbench: compile only: answers are built, none runs; nothing is "
                       "judged or timed")
    if check_only:
        return Outlook(f"commbench: correctness only ({CHECK_ONLY}): pass rates are measured, "
                       "nothing is timed (no speedups)")
    if not worlds:
        return None
    where = f"{cpus} CPUs, load {load:.1f}"
    alone = [w for w in worlds if fits(w, 1, cpus, load)]
    widest = max(worlds)
    if not alone:
        line = (f"commbench: timing: this machine cannot time any of the {len(worlds)} timed "
                f"items ({where}; an item of W ranks needs W + 1 CPUs, {min(worlds) + 1} for "
                "the smallest): every speedup will be reported as contended, not to be read, "
                f"and pass rates are measured as usual; run with {CHECK_ONLY} for correctness "
                f"alone, or time on a machine with {cpus_needed(widest, load)} CPUs or more")
    elif len(alone) < len(worlds):
        line = (f"commbench: timing: this machine can time {len(alone)} of the {len(worlds)} "
                f"timed items ({where}; an item of W ranks needs W + 1 CPUs): those of more "
                f"than {max(alone)} ranks will be reported as contended, not to be read; pass "
                f"rates are measured as usual ({CHECK_ONLY}: correctness alone)")
    else:
        line = (f"commbench: timing: this machine can time all {len(worlds)} timed items "
                f"({where}; the widest, {widest} ranks, needs {widest + 1} CPUs): speedups "
                "come with their 90% intervals")
    at_once = min(workers, len(worlds))
    crowded = [w for w in alone if not fits(w, at_once, cpus, load)] if at_once > 1 else []
    warning = None
    if crowded:
        fewer = most_workers(max(crowded), cpus, load)
        warning = (f"commbench: warning: -n {workers} times {at_once} items at once on "
                   f"{cpus} CPUs: {len(crowded)} timed items that could be read alone "
                   f"(up to {max(crowded)} ranks, {max(crowded) + 1} CPUs each) will be "
                   "contended; "
                   + (f"-n {fewer} or fewer times them readably" if fewer > 1 else
                      "without -n they are timed readably")
                   + f", or {CHECK_ONLY} skips the timing")
    return Outlook(line, warning)


ITEM_ID = re.compile(r"\[np(\d+)(?:-(.*))?\]$")


def timed_worlds(state, ids: list[str]) -> list[int]:
    """The world sizes of the items among `ids` (pytest node ids) that will be timed: a
    model's solutions (not mutants) that the platform runs."""
    from .tasks import ManifestError, load_task

    tasks: dict[str, object] = {}
    worlds = []
    for nodeid in ids:
        path, _, name = nodeid.partition("::")
        found = ITEM_ID.search(name)
        if found is None or (found.group(2) or "").startswith("mutant-"):
            continue
        if path not in tasks:
            try:
                tasks[path] = load_task(Path(state.config.rootpath) / path, state.suites)
            except (ManifestError, OSError):
                tasks[path] = None
        task, world = tasks[path], int(found.group(1))
        if task is not None and not state.platform.skip_reason(task, world):
            worlds.append(world)
    return worlds


def workers(config) -> int:
    """The xdist workers of this session (1 without -n)."""
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) and n > 1 else 1


def tell(config, state, ids: list[str]) -> None:
    """Write the run's statement (and the warning) to the terminal, before any item runs."""
    settings = state.settings
    if not ids:
        return
    worlds = [] if settings.check_only or settings.compile_only else timed_worlds(state, ids)
    cpus, load = machine()
    said = outlook(worlds, workers(config), cpus, load, settings.check_only,
                   settings.compile_only)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if said is None or reporter is None:
        return
    reporter.write_line(said.line)
    if said.warning:
        reporter.write_line(said.warning, yellow=True, bold=True)
