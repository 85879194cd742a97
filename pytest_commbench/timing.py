"""Statistics of timed repetitions and the per-size figures derived from them."""

from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
_RATES = {"B/s": 1.0, "KB/s": 1e-3, "MB/s": 1e-6, "GB/s": 1e-9, "TB/s": 1e-12}


@dataclass(frozen=True)
class Stats:
    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "spread": self.spread}


def summarize(samples: list[float]) -> Stats:
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples")
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return Stats(float(med), float(q1), float(q3), float(a.min()), float(a.max()), int(a.size))


def max_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """Per repetition, the slowest rank's time: a collective is done when its last rank is."""
    lengths = {len(t) for t in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks timed different numbers of repetitions: {sorted(lengths)}")
    return [float(x) for x in np.max(np.asarray(per_rank, dtype=np.float64), axis=0)]


def speedup(ref: Stats, sol: Stats) -> float:
    """perf_solution / perf_reference; for every metric here that is t_ref / t_sol (the bytes
    moved are the same, and latency is inverted)."""
    return ref.median / sol.median if sol.median > 0 else float("inf")


def metric_value(seconds: float, nbytes: int, factor: float, rule: str, unit: str) -> float | None:
    """The task's metric for one time: bandwidth the nccl-tests way, or a time in `unit`."""
    if seconds <= 0:
        return None
    if unit in _UNITS:
        return seconds * _UNITS[unit]
    if unit in _RATES and rule in ("algbw", "busbw"):
        bw = nbytes / seconds
        if rule == "busbw":
            bw *= factor
        return bw * _RATES[unit]
    return None


def job_scores(jobs_by_case: list[list[list[float]]]) -> list[float]:
    """One figure per job: the mean over sizes of the log of the job's median time. A job is
    one process, and a process's own speed (its host CPU's, its memory layout's) moves all of
    its sizes together, so jobs, not repetitions, are the independent samples of an item."""
    njobs = min(len(jobs) for jobs in jobs_by_case)
    return [float(np.mean([np.log(np.median(jobs[j])) for jobs in jobs_by_case]))
            for j in range(njobs)]


def speedup_uncertainty(ref_jobs: list[list[list[float]]],
                        sol_jobs: list[list[list[float]]]) -> float | None:
    """Standard error of the log of an item's speedup (≈ its relative uncertainty), from how
    much the jobs' scores scatter: the scatter of reference and solution jobs is pooled (the
    same machine's process-to-process noise), the error is that of a difference of two means
    of R jobs each. None with fewer than two jobs per role."""
    ref, sol = job_scores(ref_jobs), job_scores(sol_jobs)
    if len(ref) < 2 or len(sol) < 2:
        return None
    squares = float(np.sum((np.array(ref) - np.mean(ref)) ** 2)
                    + np.sum((np.array(sol) - np.mean(sol)) ** 2))
    pooled = squares / (len(ref) + len(sol) - 2)
    return float(np.sqrt(pooled * (1 / len(ref) + 1 / len(sol))))


def chi2_quantile(p: float, dof: int) -> float:
    """The p-quantile of a chi-square distribution with an even number of degrees of freedom
    (the pooled scatter of 2R jobs has 2R - 2), by bisection on its closed-form CDF."""
    if dof < 2 or dof % 2:
        raise ValueError(f"an even number of degrees of freedom >= 2, got {dof}")

    def cdf(x: float) -> float:
        term, total = 1.0, 1.0
        for i in range(1, dof // 2):
            term *= (x / 2) / i
            total += term
        return 1.0 - np.exp(-x / 2) * total

    lo, hi = 0.0, float(dof) * 10 + 50
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def precise_enough(se: float | None, jobs_per_role: int, precision: float,
                   confidence: float = 0.9) -> bool:
    """Is the speedup's standard error below `precision` even at the upper `confidence` bound
    of what a scatter estimated from so few jobs may hide? (Two jobs per role give two degrees
    of freedom: the estimate alone would stop one noisy item in seven too early, and at an
    80% bound a CPU A/A item still stopped at 0.80 +/- 1.4%.)"""
    if se is None or jobs_per_role < 2:
        return False
    dof = 2 * jobs_per_role - 2
    return se * np.sqrt(dof / chi2_quantile(1 - confidence, dof)) <= precision


def t_quantile(p: float, dof: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with `dof` degrees of freedom: bisection on its
    CDF, integrated numerically (Simpson) from the density."""
    if dof < 1 or not 0.5 < p < 1:
        raise ValueError(f"dof >= 1 and 0.5 < p < 1, got {dof}, {p}")
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)

    def cdf(x: float) -> float:
        t = np.linspace(0.0, x, 2001)
        f = c * (1 + t * t / dof) ** (-(dof + 1) / 2)
        h = x / 2000
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def interval90(speedup: float, se: float | None, jobs_per_role: int) -> list[float] | None:
    """The speedup's 90% interval from the standard error of its log (Student's t on the
    2R - 2 degrees of freedom of the pooled job scatter); None without an error."""
    if se is None or jobs_per_role < 2 or not speedup or speedup <= 0:
        return None
    half = t_quantile(0.95, 2 * jobs_per_role - 2) * se
    return [speedup * math.exp(-half), speedup * math.exp(half)]


def _cpus_busy(cpus: set[int]) -> float | None:
    """Seconds the given CPUs have spent busy since boot (/proc/stat: everything but idle
    and iowait; guest time is already in user), None where it cannot be read."""
    total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if not name[3:].isdigit():
                    break
                if int(name[3:]) in cpus:
                    v = [int(x) for x in fields[:8]]
                    total += sum(v) - v[3] - v[4]
    except (OSError, ValueError, IndexError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    """CPU seconds of this process and of the children it has reaped (the jobs it ran and
    everything under them: mpiexec reaps its ranks, the sandbox's init its launcher)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


CONTENTION_SLACK_CPUS = 0.25  # CPUs of demand beyond the supply that are not contention


class HostLoad:
    """How busy this process's CPUs were while an item was timed, and by whom: the busy time
    of the CPUs it may run on (/proc/stat) less its own and its jobs' CPU time is the load
    from outside the item (other pytest-xdist workers, other programs). `contended`: the
    item's busy ranks, the observer and that load need more CPUs than there are (on a
    2-CPU machine two spinning ranks leave the observer and the system no CPU, and calls
    of a few microseconds were seen stalled for a scheduler tick in most batches)."""

    def __init__(self) -> None:
        self.cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else set(range(os.cpu_count() or 1))
        self.started = self.busy0 = self.own0 = None

    def start(self) -> None:
        self.started, self.busy0, self.own0 = time.monotonic(), _cpus_busy(self.cpus), _own_cpu()

    def stop(self, busy_ranks: int) -> dict[str, Any]:
        """{cpus, ranks, outside_cpus (mean CPUs busy with other work; None: unknown),
        contended}."""
        wall = time.monotonic() - (self.started or time.monotonic())
        busy = _cpus_busy(self.cpus)
        outside = None
        if self.busy0 is not None and busy is not None and wall > 0:
            outside = max(0.0, (busy - self.busy0 - (_own_cpu() - self.own0)) / wall)
        # the ranks, the observer (it wakes for every gate and "done") and the other load
        demand = busy_ranks + 1 + (outside or 0.0)
        return {"cpus": len(self.cpus), "ranks": busy_ranks,
                "outside_cpus": None if outside is None else round(outside, 2),
                "contended": demand > len(self.cpus) + CONTENTION_SLACK_CPUS}
