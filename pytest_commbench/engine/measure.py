"""Measurement: the timing policy of an item in one place. The solution's correctness first
(an untimed check job), a warm-up job of the reference, then reference and solution jobs in
ABBA order for at least `timing_rounds` rounds, and more while the speedup is less precise
than asked (up to `timing_max_rounds`, none past the minimum on a contended host); then the
per-size figures and how far the speedup may be read.

The jobs are run by the job runner it is given (`job.run_job`; tests give a fake), so the
policy is tested without launching a rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import observer
from ..rank.protocol import NATIVE_LANGUAGES
from ..record import MachineLoad, Size
from ..timing import (
    HostLoad,
    interval90,
    metric_value,
    precise_enough,
    speedup,
    speedup_uncertainty,
    summarize,
)
from ..verdicts import Rejected, Verdict
from .plan import InfraError, JobRunner, Outcome, Plan

OUTPUT_IN_RECORD = 4000  # characters of a job's output kept in its item's result

#: per role ("ref", "sol") and case, one list of max-over-ranks call times per job
Times = dict[str, dict[str, list[list[float]]]]


@dataclass
class Measurement:
    """What an item's jobs measured (a check-only item: the solution's one job)."""

    times: Times
    output: str = ""  # the solution's last job's output
    rounds: int = 0  # timing rounds run (0: not timed)
    stopped: str | None = None  # why no more rounds were added early ("contended")
    speedup_se: float | None = None  # the standard error of the speedup's log
    compared: bool = False  # some case has times of both sides (speedup_se is theirs)
    imprecise: bool = True  # the precision asked for was not reached
    host_load: MachineLoad | None = None
    # per case and role, the medians of the untimed phases (GPU: upload, fetch), microseconds
    untimed_phases_us: dict[str, Any] = field(default_factory=dict)
    # per job of a timed item, in the order they ran: its (start, cases, end) seconds
    job_phases_s: dict[str, tuple[float, float, float] | None] = field(default_factory=dict)


def rejected(outcome: Outcome) -> Rejected:
    """The solution's failure, as its job showed it (its output kept for the result)."""
    return Rejected(outcome.verdict, outcome.message, outcome.detail,
                    output=outcome.output[-OUTPUT_IN_RECORD:])


def reference_failed(outcome: Outcome) -> str:
    """The message of an item whose reference failed, with the evidence (a hung reference's
    ranks and stacks, a wrong answer's other messages)."""
    text = f"the reference failed ({outcome.verdict}): {outcome.message}"
    return f"{text}\n{outcome.detail[-4000:]}" if outcome.detail else text


SANITIZED_SIZES = 2  # the smallest sizes are checked under the memory checker
SANITIZER_SLOWDOWN = 3  # ... with this many times the task's deadline


def sanitizer_tool(plan: Plan) -> str | None:
    """The memory checker's tool the item's answer runs under (None: none): a compiled
    answer on a platform that has a checker; `auto` is memcheck where there is one."""
    tool = plan.settings.sanitizer
    if tool == "off" or plan.task.language not in NATIVE_LANGUAGES:
        return None
    tool = "memcheck" if tool == "auto" else tool
    if plan.platform.sanitizer(tool, plan.settings.work) is None:
        if plan.settings.sanitizer == "auto":
            return None
        raise InfraError(f"--commbench-sanitizer={tool}: platform {plan.platform.name} has no "
                         "memory checker (compute-sanitizer not found)")
    return tool


def sanitize(plan: Plan, artifact: Path, run_job: JobRunner) -> None:
    """One more job of the answer, its ranks under the memory checker, at the task's smallest
    sizes, trials only: an access out of bounds, a race on shared memory or an uninitialized
    read that happened to give the right bytes is a wrong answer with the checker's report."""
    tool = sanitizer_tool(plan)
    if tool is None:
        return
    counts = sorted({c.count for c in plan.cases})[:SANITIZED_SIZES]
    small = replace(plan, cases=[c for c in plan.cases if c.count in counts],
                    deadline=plan.deadline * SANITIZER_SLOWDOWN)
    outcome = run_job(small, artifact, plan.settings.work / "sanitize", False, sanitize=tool)
    if outcome.verdict is not Verdict.PASS:
        raise rejected(outcome)


def uncertainty(times: Times, plan: Plan) -> tuple[bool, float | None, bool]:
    """Whether any case has times of both sides; the speedup's standard error so far; and
    whether it is less precise than asked."""
    ids = [c.id for c in plan.cases if times["ref"][c.id] and times["sol"][c.id]]
    if not ids:
        return False, None, False
    se = speedup_uncertainty([times["ref"][i] for i in ids], [times["sol"][i] for i in ids])
    jobs = min(len(times[who][i]) for who in ("ref", "sol") for i in ids)
    return True, se, not precise_enough(se, jobs, plan.settings.timing_precision)


def measure(plan: Plan, artifacts: dict[str, Path], run_job: JobRunner,
            load_factory: Callable[[], HostLoad] | None = None) -> Measurement:
    """Run the item's jobs (`artifacts`: "sol", and "ref" where the item is timed) and return
    what they measured. Raises the solution's failure as `Rejected` (at its first failing
    job), a reference's as `InfraError`."""
    settings = plan.settings
    timed = "ref" in artifacts
    times: Times = {who: {c.id: [] for c in plan.cases} for who in artifacts}
    result = Measurement(times)
    order = list(artifacts)
    baseline: dict[str, tuple[float, float] | None] = {}
    phases: dict[str, dict[str, list[list[float]]]] = {}
    if timed:
        # the solution's correctness first, untimed (its trials and a few checked calls): a
        # wrong answer is known before any reference job is spent on it
        outcome = run_job(plan, artifacts["sol"], settings.work / "check", False)
        if outcome.verdict is not Verdict.PASS:
            raise rejected(outcome)
        result.job_phases_s["check"] = outcome.phases_s
        sanitize(plan, artifacts["sol"], run_job)
        # a warm-up job of the reference, timed like the others, its times thrown away:
        # whatever the first job of an item pays (page cache, input files being written back,
        # cold imports, devices waking from idle) is paid here; on 2x H200 the first timed
        # job of an item was often the slowest of all, and with ABBA it is always a
        # reference job, so without this the solution looked a few per cent faster
        outcome = run_job(plan, artifacts["ref"], settings.work / "warmup", True, trials=False)
        if outcome.verdict is not Verdict.PASS:
            raise InfraError(reference_failed(outcome))
        result.job_phases_s["warmup"] = outcome.phases_s
        # what the harness's own upload and fetch take, per case: beyond it, the untimed
        # phases are charged to every later job, the reference's as well (observer.charged)
        baseline = {cid: observer.phase_baseline(ts) for cid, ts in outcome.times.items()}
        plan.batches.update(outcome.batches)
    load = (load_factory or HostLoad)()  # looked up here: a test may stand in for it
    load.start()
    least = settings.timing_rounds if timed else 1
    most = max(least, settings.timing_max_rounds) if timed and settings.reps > 0 else least
    rnd = 0

    def more() -> bool:
        """Another round past the minimum: while the speedup is imprecise, unless the host
        is contended (more CPUs busy than there are: no number of rounds makes that timing
        readable, so none are paid for; the summary says the speedup is not to be read)."""
        if rnd >= most or not uncertainty(times, plan)[2]:
            return False
        if settings.timing_contended != "stop":
            return True
        if MachineLoad.from_json(load.stop(plan.world)).contended:
            result.stopped = "contended"
            return False
        return True

    while rnd < least or more():
        for who in (order if rnd % 2 == 0 else order[::-1]):
            # the reference's jobs time and check fresh inputs, but skip the trials (only
            # the solution's correctness is in question, and they cost the large sizes most)
            outcome = run_job(plan, artifacts[who], settings.work / f"{who}{rnd}", timed,
                              trials=who == "sol")
            if outcome.verdict is not Verdict.PASS:
                if who == "ref":
                    raise InfraError(reference_failed(outcome))
                raise rejected(outcome)
            if who == "sol":
                result.output = outcome.output
            if timed:
                result.job_phases_s[f"{who}{rnd}"] = outcome.phases_s
            for cid, ts in outcome.times.items():
                times[who][cid].append(observer.charged(ts, baseline.get(cid)))
                if timed and ts and plan.platform.staged:
                    # per case and job, the medians of the untimed phases (microseconds):
                    # the evidence behind any charge, and where a slow harness copy shows
                    phases.setdefault(cid, {}).setdefault(who, []).append(
                        [round(float(np.median([t.before for t in ts])) * 1e6, 1),
                         round(float(np.median([t.after for t in ts])) * 1e6, 1)])
        rnd += 1
    if not timed:
        sanitize(plan, artifacts["sol"], run_job)
    result.untimed_phases_us = {
        cid: {"baseline": [round(b * 1e6, 1) for b in baseline[cid]]
              if baseline.get(cid) else None, **per_role}
        for cid, per_role in phases.items()}
    if timed:
        result.rounds = rnd
        result.compared, result.speedup_se, result.imprecise = uncertainty(times, plan)
        # every rank keeps a CPU busy (MPI progress, a spinning device synchronize)
        result.host_load = MachineLoad.from_json(load.stop(plan.world))
    return result


def figures(plan: Plan, measured: Measurement) -> tuple[list[Size], float | None]:
    """Per size: both sides' times and spreads, the task's metric, the speedup and each job's
    median; and the item's speedup (the geometric mean over sizes)."""
    task, op = plan.task, plan.op
    sizes, ratios = [], []
    for case in plan.cases:
        sol_jobs, ref_jobs = measured.times["sol"][case.id], measured.times["ref"][case.id]
        sol = summarize([t for job in sol_jobs for t in job])
        ref = summarize([t for job in ref_jobs for t in job])
        nbytes, factor = op.bytes(case.count, case.dtype, case.world, case.params)
        s = speedup(ref, sol)
        ratios.append(s)
        m = task.metric
        sizes.append(Size(
            count=case.count, dtype=case.dtype, bytes=nbytes,
            t_sol_us=sol.median * 1e6, t_ref_us=ref.median * 1e6,
            spread_sol=sol.spread, spread_ref=ref.spread, n=sol.n, metric=m.name, unit=m.unit,
            value_sol=metric_value(sol.median, nbytes, factor, m.bytes, m.unit),
            value_ref=metric_value(ref.median, nbytes, factor, m.bytes, m.unit),
            speedup=s,
            # each job's median, in the order the jobs ran: drift and job-to-job noise show here
            jobs_sol_us=tuple(float(np.median(j)) * 1e6 for j in sol_jobs),
            jobs_ref_us=tuple(float(np.median(j)) * 1e6 for j in ref_jobs),
            batch=plan.batches.get(case.id, 1)))
    return sizes, float(np.exp(np.mean(np.log(ratios)))) if ratios else None


def trust(sizes: list[Size], value: float | None,
          measured: Measurement, shared: bool) -> tuple[list[float] | None, str]:
    """How far the speedup may be read: its 90% interval, and `timing_trust`: `shared` (the
    ranks shared a GPU: two programs time-sliced or under MPS on one device, not what either
    does over NVLink), `contended` (the item's ranks and the load from outside it needed more
    CPUs than there were), `noisy` (the precision asked for was not reached in the timing
    rounds allowed), else `ok`. Bands are only given to trusted speedups whose interval lies
    inside one band."""
    jobs = min((min(len(s.jobs_sol_us), len(s.jobs_ref_us)) for s in sizes), default=0)
    ci90 = interval90(value, measured.speedup_se, jobs)
    load = measured.host_load
    level = ("shared" if shared else "contended" if load is not None and load.contended else
             "noisy" if measured.imprecise else "ok")
    return ci90, level


SKEW_FACTOR = 10  # a call shorter than this many times a node's clock uncertainty is noisy


def blurred_by_skew(sizes: list[Size], skew_us: dict[str, float] | None) -> bool:
    """Whether a job over several nodes timed a size whose call lasts less than SKEW_FACTOR
    times the largest uncertainty of a node's clock offset: the gates of such a call open
    with a spread comparable to the call itself (`clock_skew_us`; each rank's done - gate is
    on its own node's clock, but the gates are opened from the controller's)."""
    worst = max((skew_us or {}).values(), default=0.0)
    return worst > 0 and any(min(s.t_ref_us, s.t_sol_us) < SKEW_FACTOR * worst
                             for s in sizes if s.t_ref_us and s.t_sol_us)
