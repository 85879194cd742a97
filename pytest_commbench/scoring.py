"""The benchmark's scores, as the CommBench paper defines them.

- per size: speedup s = perf_solution / perf_reference (latency inverted)
- per task: geometric mean over sizes; band Better s >= 1.20, Comparable 0.95 <= s < 1.20,
  Degraded 0.60 <= s < 0.95, Severely degraded s < 0.60
- a task (one model answer judged at every world size the platform runs) passes when every
  applicable world size passes; its speedup is the geometric mean over them
- Pass Rate = passes / applicable tasks; PASS+Good = passes with s >= 0.95 / applicable
- GM-Speedup = geometric mean of task speedups over passing tasks with a metric
- Pass x GM = Pass Rate x GM-Speedup (the ranking metric); Price = mean cost per task
  (unknown, None, where no answer's cost is known)
- fast_p = tasks that pass with speedup > p / applicable tasks, at p = 0, 1, 1.5
  (KernelBench's fast_p; None where no passing task was timed)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .record import ResultLine, as_lines
from .verdicts import Verdict

#: what the scores read: typed lines, or their JSON (read as lines)
Records = Iterable[ResultLine | Mapping[str, Any]]

GOOD = 0.95
FAST_P = (0.0, 1.0, 1.5)  # KernelBench's thresholds of fast_p
BANDS = ((1.20, "Better"), (0.95, "Comparable"), (0.60, "Degraded"), (0.0, "Severely degraded"))
# not the model's doing: the platform cannot run the task, or the harness failed. An item that
# started and never ended ("aborted": the run was killed, its worker died, or the solution
# killed it) is applicable and not passed: a solution must not turn a fail into "not
# applicable" by taking its own process down
NOT_APPLICABLE = ("skipped", "infra_error")
# a mutant that was not judged (the checker's test, not a model's: nothing to charge)
MUTANT_UNJUDGED = (*NOT_APPLICABLE, "aborted")


INCONCLUSIVE = "inconclusive"
UNTIMED = "untimed"  # a pass without a speedup (a check-only run)
# every band a pass is counted in (the leaderboard's Figure 2), in order: the named ones from
# the best down, then the passes without one
BAND_ORDER = tuple(name for _, name in BANDS) + (INCONCLUSIVE, UNTIMED)
# the worst of a task's items' timing trust is the task's
TRUST_ORDER = ("ok", "noisy", "contended", "shared")
# trusts whose speedups get no band, whatever their interval: contention biases every job
# alike, and ranks sharing a GPU measure neither NVLink nor the program on its own devices
UNBANDED = ("contended", "shared")


def scored(record: ResultLine | Mapping[str, Any]) -> bool:
    """Does the record count in the scores? Not where the platform could not run the task or
    the harness failed, and not an answer of a compile-only run (`--commbench-compile-only`:
    it was built, never run, so neither its builds nor its compile errors are a Pass Rate)."""
    r = ResultLine.of(record)
    return r.verdict not in NOT_APPLICABLE and not r.result.compile_only


def band(speedup: float | None, interval: list[float] | None = None,
         trust: str | None = None) -> str:
    """The speedup's band. Given a timing trust (timed records have one), a band is only
    named where the speedup's 90% interval lies inside that band and the timing was not
    contended (contention biases every job alike, which no interval shows; a `noisy`
    speedup's wide interval speaks for itself); otherwise `inconclusive`. Without a trust
    (records of older runs): the speedup's band."""
    if speedup is None:
        return ""
    if trust is not None:
        if trust in UNBANDED or not interval:
            return INCONCLUSIVE
        lo, hi = band(interval[0]), band(interval[1])
        return lo if lo == hi else INCONCLUSIVE
    for floor, name in BANDS:
        if speedup >= floor:
            return name
    return BANDS[-1][1]


def record_band(record: ResultLine | Mapping[str, Any]) -> str:
    a = ResultLine.of(record).result
    return band(a.speedup, a.speedup_ci90, a.timing_trust)


def _combine(speedups: list[float], intervals: list) -> list[float] | None:
    """The 90% interval of a geometric mean of independently measured speedups, from theirs
    (half-widths in log space add in quadrature, over n); None where any has none."""
    if not speedups or any(not iv for iv in intervals):
        return None
    gm = geomean(speedups)
    half = math.sqrt(sum((math.log(iv[1] / iv[0]) / 2) ** 2 for iv in intervals)) / len(speedups)
    return [gm * math.exp(-half), gm * math.exp(half)]


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Scores:
    applicable: int
    passes: int
    good: int
    not_applicable: int
    pass_rate: float | None
    pass_good: float | None
    gm_speedup: float | None
    pass_x_gm: float | None
    price: float | None
    # 90% intervals of GM-Speedup and Pass x GM from the timing error alone (None where a
    # passing task's speedup has no interval)
    gm_ci90: list[float] | None = None
    pass_x_gm_ci90: list[float] | None = None
    # (p, fast_p) for each threshold of FAST_P
    fast: tuple[tuple[float, float | None], ...] = ()


def per_task(records: Records) -> list[ResultLine]:
    """One record per task (and candidate) from its items' records, one per world size: the
    paper scores tasks, not world sizes. Not applicable when no world size is; else it passes
    when every applicable world size passed (its verdict is otherwise the first failing
    one's), its speedup is the geometric mean of theirs, its cost the sum (an answer's cost is
    counted by the item that asked for it)."""
    groups: dict[tuple, list[ResultLine]] = {}
    for r in as_lines(records):
        key = r.item.task or r.item.nodeid or id(r)  # a record of no task: its own
        groups.setdefault((r.item.model or "", key, r.item.candidate), []).append(r)
    out = []
    for items in groups.values():
        if len(items) == 1:
            out.append(items[0])
            continue
        applicable = [r for r in items if scored(r)]
        first = (applicable or items)[0]
        failing = [r for r in applicable if r.verdict != Verdict.PASS]
        a = first.result
        worlds = tuple(sorted(r.item.world for r in items if r.item.world is not None))
        usage = a.usage.evolve(cost=sum(r.result.usage.dollars for r in items))
        if not applicable:
            out.append(replace(first, worlds=worlds, attempt=replace(a, usage=usage)))
            continue
        if failing:
            a = a.evolve(verdict=failing[0].verdict, message=failing[0].result.message,
                         speedup=None)
        else:
            trusts = [r.result.timing_trust for r in applicable if r.result.timing_trust]
            a = a.evolve(verdict=Verdict.PASS.value,
                         speedup=geomean(r.result.speedup for r in applicable))
            if trusts:
                a = replace(a, timing_trust=max(trusts, key=lambda t: TRUST_ORDER.index(t)
                                                if t in TRUST_ORDER else len(TRUST_ORDER)))
            if a.speedup is not None and trusts:
                a = replace(a, speedup_ci90=_combine([r.result.speedup for r in applicable],
                                                     [r.result.speedup_ci90
                                                      for r in applicable]))
        out.append(replace(first, worlds=worlds, attempt=replace(a, usage=usage)))
    return out


def cost_known(record: ResultLine | Mapping[str, Any]) -> bool:
    """Whether a record's cost is known: it names the price it was computed with, or it cost
    something (older logs name no price). A model with no price (or no token accounting, as
    the built-in ones) records a cost of 0, which is no price of $0."""
    return ResultLine.of(record).result.usage.known


def fast_p(tasks: Records, thresholds: Iterable[float] = FAST_P
           ) -> tuple[tuple[float, float | None], ...]:
    """KernelBench's fast_p over the applicable tasks (one record per task, as `per_task`
    gives them): the share that pass with a speedup above p. None where no passing task has a
    speedup (a check-only run measured none: a zero would say every answer was slow)."""
    applicable = [t for t in as_lines(tasks) if scored(t)]
    timed = [t for t in applicable if t.passed and t.result.timed]
    if not applicable or not timed:
        return tuple((p, None) for p in thresholds)
    return tuple((p, sum(1 for t in timed if t.result.speedup > p) / len(applicable))
                 for p in thresholds)


def score(records: Records) -> Scores:
    """Scores over solution records (mutant records are the checker's test, not a model's),
    task by task as the paper scores them (`per_task`: a task's world sizes are one result)."""
    solutions = [r for r in as_lines(records) if r.is_solution]
    recs = per_task(solutions)
    applicable = [r for r in recs if scored(r)]
    passes = [r for r in applicable if r.passed]
    good = [r for r in passes if r.result.speedup is not None and r.result.speedup >= GOOD]
    n = len(applicable)
    pass_rate = len(passes) / n if n else None
    gm = geomean(r.result.speedup for r in passes)
    timed = [r for r in passes if r.result.speedup is not None]
    gm_ci = _combine([r.result.speedup for r in timed], [r.result.speedup_ci90 for r in timed])
    costs = [r.result.usage.dollars for r in applicable]
    priced = any(r.result.usage.known for r in solutions if scored(r))
    return Scores(
        applicable=n,
        passes=len(passes),
        good=len(good),
        not_applicable=len(recs) - n,
        pass_rate=pass_rate,
        pass_good=len(good) / n if n else None,
        gm_speedup=gm,
        pass_x_gm=pass_rate * gm if pass_rate is not None and gm is not None else None,
        price=sum(costs) / n if n and priced else None,
        gm_ci90=gm_ci,
        pass_x_gm_ci90=[pass_rate * x for x in gm_ci] if gm_ci and pass_rate is not None
        else None,
        fast=fast_p(recs),
    )


def breakdown(records: Records, key: str) -> list[tuple[str, Scores]]:
    """Scores per value of one of the tasks' dimensions (category, difficulty, setup,
    library)."""
    groups: dict[str, list[ResultLine]] = {}
    for r in as_lines(records):
        groups.setdefault(str(r.item.of(key)), []).append(r)
    return [(k, score(v)) for k, v in sorted(groups.items())]


def wilson(passes: int, n: int, z: float = 1.645) -> list[float] | None:
    """The 90% Wilson score interval of a pass rate of `passes` out of `n` tasks (a group of a
    figure: few tasks, where a bootstrap of the group alone says little); None for no task."""
    if n <= 0:
        return None
    p = passes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# the uncertainty of the scores over tasks: which tasks a suite has is itself a draw
RESAMPLES = 2000
BOOTSTRAP_SEED = 20261201
LEVEL = 0.90


@dataclass(frozen=True)
class Intervals:
    """Percentile intervals (LEVEL) of the scores from resampling the tasks; None where the
    score itself is none."""
    pass_rate: list[float] | None
    pass_good: list[float] | None
    gm_speedup: list[float] | None
    pass_x_gm: list[float] | None
    tasks: int = 0
    resamples: int = RESAMPLES
    seed: int = BOOTSTRAP_SEED
    level: float = LEVEL


def bootstrap(records: Records, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
              level: float = LEVEL) -> Intervals:
    """Intervals of Pass Rate, PASS+Good, GM-Speedup and Pass x GM over tasks: the applicable
    tasks are drawn with replacement `resamples` times (a task's samples go together) and each
    score is computed on every draw as `score` computes it; the interval is the central
    `level` of the draws, widened where needed to hold the score itself. Deterministic (a
    fixed seed). A draw in which nothing passes has Pass x GM 0."""
    import numpy as np

    records = [r for r in as_lines(records) if r.is_solution]
    point = score(records)
    clusters: dict[object, list[ResultLine]] = {}
    for t in per_task(records):
        if scored(t):
            clusters.setdefault(t.item.task or t.item.nodeid or id(t), []).append(t)
    n = len(clusters)
    if n == 0:
        return Intervals(None, None, None, None, 0, resamples, seed, level)
    groups = list(clusters.values())
    applicable = np.array([len(g) for g in groups], dtype=float)
    passes = np.array([sum(t.passed for t in g) for g in groups], dtype=float)
    good = np.array([sum(t.passed and t.result.speedup is not None
                         and t.result.speedup >= GOOD for t in g) for g in groups], dtype=float)
    timed = np.array([sum(t.passed and t.result.timed for t in g) for g in groups],
                     dtype=float)
    logs = np.array([sum(math.log(t.result.speedup) for t in g
                         if t.passed and t.result.timed) for g in groups])
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    a, p, g_, k, lg = (x[draws].sum(axis=1) for x in (applicable, passes, good, timed, logs))
    pass_rate, pass_good = p / a, g_ / a
    with np.errstate(divide="ignore", invalid="ignore"):
        gm = np.where(k > 0, np.exp(lg / np.maximum(k, 1)), np.nan)
    pass_x_gm = np.where(p == 0, 0.0, pass_rate * gm)
    tail = 100 * (1 - level) / 2

    def interval(values, estimate: float | None) -> list[float] | None:
        if estimate is None:
            return None
        values = values[~np.isnan(values)]
        if values.size == 0:
            return [estimate, estimate]
        lo, hi = (float(x) for x in np.percentile(values, [tail, 100 - tail]))
        return [min(lo, estimate), max(hi, estimate)]

    return Intervals(interval(pass_rate, point.pass_rate), interval(pass_good, point.pass_good),
                     interval(gm, point.gm_speedup), interval(pass_x_gm, point.pass_x_gm),
                     n, resamples, seed, level)


# -- samples and rounds ----------------------------------------------------------------------

def pass_at_ks(records: Records) -> list[tuple[int, float]]:
    """pass@k for every k up to the samples per task (unbiased estimator, mean over the
    applicable tasks); empty where there was one sample per task."""
    samples: dict[str, list[bool]] = {}
    for t in per_task(records):
        if t.item.sample is not None and scored(t):
            samples.setdefault(t.item.task, []).append(t.passed)
    if not samples:
        return []
    most = min(len(v) for v in samples.values())
    return [(k, sum(pass_at_k(len(v), sum(v), k) for v in samples.values()) / len(samples))
            for k in range(1, most + 1)]


def passes_by_round(records: Records) -> list[tuple[int, int]]:
    """Cumulative task passes after each refinement round (the paper's Table 3); empty where
    no record went through rounds. A task passes in round r when every applicable world size
    had passed by then; a task is one model's (records of several models are several tasks,
    as `per_task` counts them)."""
    records = as_lines(records)
    rounds = max((len(r.result.round_history or ()) for r in records), default=0)
    if rounds == 0:
        return []
    tasks: dict[tuple, list[ResultLine]] = {}
    for r in records:
        if scored(r):
            tasks.setdefault((r.item.model or "", r.item.task, r.item.candidate),
                             []).append(r)
    out = []
    for n in range(1, rounds + 1):
        out.append((n, sum(1 for items in tasks.values() if all(
            r.result.round is not None and r.result.round <= n for r in items))))
    return out


def best_of_samples(records: Records) -> list[ResultLine]:
    """Per task (and model), its samples' best result: the fastest passing sample (a pass
    without a speedup counts below any timed one), else the first sample's. What K
    independent agent runs give a task (`--commbench-samples K`); records of one sample per
    task come back as they are, task by task."""
    groups: dict[tuple, list[ResultLine]] = {}
    for t in per_task(records):
        groups.setdefault((t.item.model or "", t.item.task or t.item.nodeid), []).append(t)
    out = []
    for runs in groups.values():
        passing = [t for t in runs if t.passed]
        best = max(passing, key=lambda t: t.result.speedup or 0.0) if passing else \
            sorted(runs, key=lambda t: str(t.item.candidate))[0]
        out.append(best)
    return out


# -- how items end ------------------------------------------------------------------------------

#: every outcome an item can have, in the order a failure anatomy shows them
OUTCOMES = ("pass", "wrong_answer", "compile_error", "runtime_error", "timeout", "forbidden",
            "tampered", "no_solution", "truncated", "aborted", "infra_error", "skipped")


def outcomes(records: Records) -> dict[str, int]:
    """A failure anatomy: how many items ended in each outcome (every outcome of OUTCOMES,
    zeros included, then any other a record names)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in as_lines(records):
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    return counts


# -- two runs side by side ----------------------------------------------------------------------

@dataclass
class Comparison:
    """What changed from run A to run B, item by item (an item: a node id and its sample)."""

    verdicts: list[tuple[str, str, str]]  # (item, A's verdict, B's): every change
    # (item, A's speedup, its interval, B's, its interval, "faster"/"slower"): passes in both
    # whose 90% intervals do not overlap; a speedup without an interval never counts as moved
    moved: list[tuple[str, float, list[float], float, list[float], str]]
    steady: int  # items passing in both whose speedup did not move beyond its intervals
    new: list[str]  # items only in B
    removed: list[str]  # items only in A


def _by_item(records: Records) -> dict[str, ResultLine]:
    # the later record of an item wins, as in a report
    return {r.item.key: r for r in as_lines(records)}


def compare(a: Records, b: Records) -> Comparison:
    """Run A against run B: verdict changes, speedups that moved beyond both intervals, items
    new in B and items B no longer has."""
    ra, rb = _by_item(a), _by_item(b)
    verdicts, moved, steady = [], [], 0
    for item in sorted(set(ra) & set(rb)):
        x, y = ra[item], rb[item]
        vx, vy = x.verdict, y.verdict
        if vx != vy:
            verdicts.append((item, vx, vy))
            continue
        sx, sy = x.result.speedup, y.result.speedup
        if vx != Verdict.PASS or sx is None or sy is None:
            continue
        ix, iy = x.result.speedup_ci90, y.result.speedup_ci90
        if ix and iy and (iy[0] > ix[1] or iy[1] < ix[0]):
            moved.append((item, sx, list(ix), sy, list(iy),
                          "faster" if iy[0] > ix[1] else "slower"))
        else:
            steady += 1
    return Comparison(verdicts, moved, steady, sorted(set(rb) - set(ra)),
                      sorted(set(ra) - set(rb)))


def worse(cmp: Comparison) -> list[tuple[str, str, str]]:
    """The verdict changes from a pass to anything else: what fails a comparison."""
    return [(item, x, y) for item, x, y in cmp.verdicts if x == Verdict.PASS]


def slower(cmp: Comparison, fraction: float) -> list[tuple[str, float, list[float], float,
                                                           list[float], str]]:
    """Passes in both whose speedup fell by more than `fraction` of A's and beyond both 90%
    intervals (pytest-benchmark's compare-fail, with the noise the records measured: a drop
    inside the intervals, or of a speedup without one, is no evidence)."""
    return [m for m in cmp.moved if m[5] == "slower" and m[3] < m[1] * (1 - fraction)]
