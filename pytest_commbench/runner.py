"""Run one candidate of one task at one world size and decide its verdict.

This is the controller side of the trust boundary: it owns the secret seed, writes the inputs,
launches reference and solution jobs (interleaved, in separate processes), and judges what the
ranks wrote with the task's oracle. It never imports solution code.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import checks, regions
from .checks.base import Case
from .launch import JobResult, mpi_env, run_job
from .models.base import Candidate, Reply
from .platforms.base import Platform
from .tasks import Task
from .timing import (
    max_over_ranks,
    metric_value,
    precise_enough,
    speedup,
    speedup_uncertainty,
    summarize,
)
from .verdicts import Rejected, Verdict

MAX_MESSAGES = 5
# Open MPI's report of a rank killed by a signal (mpirun 4.x and prterun 5.x say the same)
LAUNCHER_DEATH = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+\S+\s+"
                            r"exited\s+on\s+signal\s+(\d+)(?:\s+\(([^)]*)\))?")
OUTPUT_IN_RECORD = 4000


@dataclass
class Settings:
    seed: int  # this item's seed, derived from the run's secret seed
    work: Path  # this item's scratch directory
    cache: Path  # build cache shared by the run
    references: Path
    rounds: int = 2  # interleaved reference/solution rounds at least ...
    max_rounds: int = 6  # ... and at most, while the speedup is less precise than
    precision: float = 0.03  # this (standard error of its log, from the jobs' scatter)
    reps: int = 10  # minimum timed repetitions per size and job
    max_reps: int = 200  # ... and the most, while the time budget lasts
    budget_s: float = 0.25  # timed seconds per size and job the repetitions may add up to
    warmup: int = 2
    timeout: float | None = None  # overrides the manifest's per-job deadline
    keep: bool = False
    exclusive: bool = True  # timed items hold the whole node (GPU platforms)


@dataclass
class Outcome:
    """What one job showed: failure (verdict, message, detail) or per-case max-over-ranks times."""

    verdict: Verdict
    message: str = ""
    detail: str = ""
    times: dict[str, list[float]] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0


class InfraError(Exception):
    """The harness, the reference or the machine failed; not the solution's fault."""


def run_candidate(task: Task, world: int, candidate: Candidate, platform: Platform,
                  settings: Settings) -> dict[str, Any]:
    """Return the result record (without run-level fields) for one item."""
    started = time.time()
    record: dict[str, Any] = {
        "verdict": None, "message": "", "detail": "", "speedup": None, "sizes": [],
        "tokens_in": 0, "tokens_out": 0, "cost": 0.0, "rounds": 1, "output": "",
    }
    try:
        _run(task, world, candidate, platform, settings, record)
    except Rejected as exc:
        record.update(verdict=exc.verdict, message=exc.message, detail=exc.detail)
    except InfraError as exc:
        record.update(verdict=Verdict.INFRA_ERROR, message=str(exc))
    except Exception as exc:  # noqa: BLE001 - a harness bug is an infra_error, never a crash
        record.update(verdict=Verdict.INFRA_ERROR,
                      message=f"harness error: {exc.__class__.__name__}: {exc}",
                      detail=traceback.format_exc())
    record["verdict"] = str(record["verdict"])
    record["duration_s"] = round(time.time() - started, 3)
    if not settings.keep:
        _tidy(settings.work, everything=record["verdict"] == "pass")
    return record


def _tidy(work: Path, everything: bool) -> None:
    """Free the disk: a passing item leaves nothing; a failing one keeps its solution, job
    files, rank status and output logs (for a human to look at), not its data arrays."""
    if everything:
        shutil.rmtree(work, ignore_errors=True)
        return
    for npy in work.rglob("*.npy") if work.exists() else ():
        npy.unlink(missing_ok=True)


def _produce(candidate: Candidate) -> Reply:
    try:
        return candidate.produce()
    except Exception as exc:  # noqa: BLE001 - a model source that fails is an outage
        return Reply(None, infra_error=f"{exc.__class__.__name__}: {exc}")


def _run(task, world, candidate, platform, settings, record) -> None:
    reply = _produce(candidate)
    record.update(tokens_in=reply.tokens_in, tokens_out=reply.tokens_out, cost=reply.cost,
                  rounds=reply.rounds)
    if reply.infra_error:
        raise InfraError(f"the model source failed: {reply.infra_error}")
    template = task.template.read_text(encoding="utf-8")
    solution = regions.merge_reply(template, reply.text)
    settings.work.mkdir(parents=True, exist_ok=True)
    (settings.work / f"solution{task.suffix}").write_text(solution)
    artifact = platform.build(task, solution, settings.cache)

    timed = candidate.kind == "solution"
    ref_artifact = None
    if timed:
        ref_path = settings.references / task.relpath / f"solution{task.suffix}"
        try:
            ref_text = ref_path.read_text(encoding="utf-8")
            regions.verify(template, ref_text)
            ref_artifact = platform.build(task, ref_text, settings.cache)
        except (OSError, Rejected) as exc:
            raise InfraError(f"the reference of {task.relpath} is unusable: {exc}") from None

    op = checks.get(task.check.op)
    rng = np.random.default_rng(settings.seed)
    cases = []
    for count in task.sizes:
        for dtype in task.check.dtypes:
            cid = f"c{len(cases)}"
            cases.append(op.make_case(rng, cid, count, dtype, world, task.check.params,
                                      task.check.trials, settings.max_reps))
    reps = settings.reps
    # besides the last repetition (always checked), one chosen at random from the first `reps`
    check_reps = [int(rng.integers(0, reps))] if reps > 0 else []
    io = settings.work / "io"
    _write_inputs(io, cases)

    plan = Plan(task, world, platform, settings, op, cases, io, check_reps,
                settings.timeout or task.timeout)
    artifacts = {"ref": ref_artifact.path, "sol": artifact.path} if timed else {"sol": artifact.path}
    with platform.lease(world, exclusive=timed and settings.exclusive) as lease_env:
        times, output = _interleave(plan, artifacts, lease_env, record)
    record["output"] = output[-OUTPUT_IN_RECORD:]
    record["verdict"] = Verdict.PASS
    if timed and reps > 0:
        _figures(op, task, cases, times["sol"], times["ref"], record)


@dataclass
class Plan:
    """What every job of one item shares."""

    task: Task
    world: int
    platform: Platform
    settings: Settings
    op: checks.Op
    cases: list[Case]
    io: Path
    check_reps: list[int]
    deadline: float


def _interleave(plan: Plan, artifacts: dict[str, Path], lease_env: dict[str, str],
                record: dict[str, Any]) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Run the jobs in ABBA order (ref, sol, sol, ref, ...) so a drift over the item's time
    cancels out; stop at the solution's first failure. After the minimum rounds, add rounds
    while the speedup's uncertainty (from the scatter of the jobs) is above the precision
    asked for, up to the maximum. Returns per-case times and the solution's last output."""
    settings = plan.settings
    # per role and case, one list of max-over-ranks times per job
    times: dict[str, dict[str, list[list[float]]]] = {
        who: {c.id: [] for c in plan.cases} for who in artifacts}
    output = ""
    order = list(artifacts)
    timed = "ref" in artifacts
    if timed:
        # a warm-up job of the reference, timed like the others, its times thrown away:
        # whatever the first job of an item pays (page cache, input files being written back,
        # cold imports, devices waking from idle) is paid here; on 2x H200 the first timed
        # job of an item was often the slowest of all, and with ABBA it is always a
        # reference job, so without this the solution looked a few per cent faster
        job_dir = settings.work / "warmup"
        outcome = _judge(plan, job_dir, _run_job(plan, artifacts["ref"], job_dir, lease_env))
        if outcome.verdict is not Verdict.PASS:
            raise InfraError(f"the reference failed ({outcome.verdict}): {outcome.message}")
    rounds = settings.rounds if timed else 1
    most = max(rounds, settings.max_rounds) if timed and settings.reps > 0 else rounds
    rnd = 0
    while rnd < rounds or (rnd < most and _imprecise(times, plan, record)):
        for who in (order if rnd % 2 == 0 else order[::-1]):
            job_dir = settings.work / f"{who}{rnd}"
            outcome = _judge(plan, job_dir, _run_job(plan, artifacts[who], job_dir, lease_env))
            if outcome.verdict is not Verdict.PASS:
                if who == "ref":
                    raise InfraError(f"the reference failed ({outcome.verdict}): {outcome.message}")
                record["output"] = outcome.output[-OUTPUT_IN_RECORD:]
                raise Rejected(outcome.verdict, outcome.message, outcome.detail)
            if who == "sol":
                output = outcome.output
            for cid, ts in outcome.times.items():
                times[who][cid].append(ts)
        rnd += 1
    if timed:
        record["timing_rounds"] = rnd
        _imprecise(times, plan, record)
    return times, output


def _imprecise(times: dict[str, dict[str, list[list[float]]]], plan: Plan,
               record: dict[str, Any]) -> bool:
    """Is the speedup so far less precise than asked? (Records the uncertainty.)"""
    ids = [c.id for c in plan.cases if times["ref"][c.id] and times["sol"][c.id]]
    if not ids:
        return False
    se = speedup_uncertainty([times["ref"][i] for i in ids], [times["sol"][i] for i in ids])
    record["speedup_se"] = se
    jobs = min(len(times[who][i]) for who in ("ref", "sol") for i in ids)
    return not precise_enough(se, jobs, plan.settings.precision)


def _write_inputs(io: Path, cases: list[Case]) -> None:
    for case in cases:
        for t, trial in enumerate(case.trials):
            for rank, named in enumerate(trial.inputs):
                folder = io / case.id / f"t{t}" / f"r{rank}"
                folder.mkdir(parents=True, exist_ok=True)
                for name, array in named.items():
                    np.save(folder / f"{name}.npy", array)


def _job_spec(task, cases, io, out, scratch, path, check_reps, settings, backend) -> dict:
    return {
        "solution": str(path),
        "entry": task.entry,
        "language": task.language,
        "fixtures": list(task.fixtures),
        "workspace_bytes": task.workspace,
        "backend": backend,
        "io": str(io),
        "out": str(out),
        "scratch": str(scratch),
        "warmup": settings.warmup,
        "reps": settings.reps,
        "max_reps": settings.max_reps,
        "budget_s": settings.budget_s,
        "check_reps": check_reps,
        "cases": [
            {
                "id": c.id,
                "args": c.args,
                "params": c.params,
                "vary": list(c.vary),
                "shifts": c.shifts,
                "trials": [
                    {
                        "outputs": [{k: [list(s), d] for k, (s, d) in o.items()} for o in t.outputs],
                        "extra": t.extra,
                        "delays": t.delays,
                    }
                    for t in c.trials
                ],
            }
            for c in cases
        ],
    }


def _run_job(plan: Plan, path: Path, job_dir: Path, lease_env: dict[str, str]) -> Outcome:
    task, world, platform, settings = plan.task, plan.world, plan.platform, plan.settings
    if job_dir.exists():
        shutil.rmtree(job_dir)
    out = job_dir / "out"
    out.mkdir(parents=True)
    spec = _job_spec(task, plan.cases, plan.io, out, job_dir / "scratch", path, plan.check_reps,
                     settings, platform.backend)
    job_file = job_dir / "job.json"
    job_file.write_text(json.dumps(spec))
    def rank_failed() -> bool:
        for status in out.glob("status_r*.json"):
            try:
                if json.loads(status.read_text()).get("error"):
                    return True
            except (OSError, ValueError):
                pass  # being rewritten right now
        return False

    env = {**mpi_env(), **platform.env(), **lease_env}
    result = run_job(platform.launch_argv(world, job_file), job_dir, plan.deadline, env=env,
                     failed=rank_failed)
    return _job_outcome(result, out, world, plan.deadline)


def _job_outcome(result: JobResult, out: Path, world: int, deadline: float) -> Outcome:
    """From the ranks' status files: did every rank finish? Exit codes and printed text are
    only quoted, never believed."""
    statuses = []
    for rank in range(world):
        try:
            statuses.append(json.loads((out / f"status_r{rank}.json").read_text()))
        except (OSError, ValueError):
            statuses.append(None)
    base = Outcome(Verdict.PASS, output=result.output, seconds=result.seconds)
    if result.timed_out:
        stuck = [f"rank {r}: {s['phase']}" for r, s in enumerate(statuses) if s and not s.get("done")]
        base.verdict = Verdict.TIMEOUT
        base.message = f"the job did not finish within {deadline:g} s and was killed"
        base.detail = "; ".join(stuck)
        return base
    if all(s is None for s in statuses):
        raise InfraError(
            f"no rank started (launcher exit code {result.returncode}): "
            f"{result.output.strip()[-800:] or 'no output'}"
        )
    for rank, s in enumerate(statuses):
        if s and s.get("error") and s.get("harness"):
            raise InfraError(f"rank {rank} failed while the harness set up the world "
                             f"({s['phase']}): {s['error']}")
    for rank, s in enumerate(statuses):
        if s and s.get("error"):
            base.verdict = Verdict.RUNTIME_ERROR
            base.message = f"rank {rank} raised during {s['phase']}: {s['error']}"
            base.detail = s.get("traceback", "")
            return base
    unfinished = [r for r, s in enumerate(statuses) if s is None or not s.get("done")]
    if unfinished:
        # when one rank dies the launcher kills the rest: name the one it saw die first
        seen = LAUNCHER_DEATH.search(result.output)
        rank = int(seen.group(1)) if seen and int(seen.group(1)) in unfinished else unfinished[0]
        phase = statuses[rank]["phase"] if statuses[rank] else "start-up"
        how = f"signal {seen.group(2)}{f' ({seen.group(3)})' if seen.group(3) else ''}" if seen \
            else f"launcher exit code {result.returncode}"
        base.verdict = Verdict.RUNTIME_ERROR
        base.message = f"rank {rank} died during {phase} ({how})"
        if len(unfinished) > 1:
            base.detail = f"ranks that did not finish: {', '.join(map(str, unfinished))}"
        return base
    return base


def _load_outputs(folder: Path, world: int) -> list[dict[str, np.ndarray]]:
    got = []
    for rank in range(world):
        d = folder / f"r{rank}"
        got.append({p.stem: np.load(p, allow_pickle=False) for p in sorted(d.glob("*.npy"))})
    return got


def _judge(plan: Plan, job_dir: Path, outcome: Outcome) -> Outcome:
    if outcome.verdict is not Verdict.PASS:
        return outcome
    op, task, cases, check_reps = plan.op, plan.task, plan.cases, plan.check_reps
    out = job_dir / "out"
    errors: list[str] = []
    for case in cases:
        world = case.world
        events = []
        for rank in range(world):
            events.append(json.loads((out / case.id / f"events_r{rank}.json").read_text()))
        label = f"count={case.count} {case.dtype}"
        for t, trial in enumerate(case.trials):
            got = _load_outputs(out / case.id / f"t{t}", world)
            ev = [e["trials"][t] for e in events]
            for msg in op.verify(trial, got, ev, case, task.check.rtol, task.check.atol):
                errors.append(f"[{label}, trial {t}] {msg}")
        done = len(events[0]["times"])
        for rep in sorted({r for r in check_reps if r < done} | ({done - 1} if done else set())):
            got = _load_outputs(out / case.id / f"rep{rep}", world)
            trial = op.shifted(case, rep)
            ev = [{"t_enter": 0.0, "t_exit": 0.0}] * world  # no delays in timed repetitions
            for msg in op.verify(trial, got, ev, case, task.check.rtol, task.check.atol):
                errors.append(f"[{label}, timed repetition {rep}] {msg}")
        if events[0]["times"]:
            outcome.times[case.id] = max_over_ranks([e["times"] for e in events])
    if errors:
        outcome.verdict = Verdict.WRONG_ANSWER
        outcome.message = errors[0]
        more = errors[1:MAX_MESSAGES]
        outcome.detail = "\n".join(more + ([f"... {len(errors) - MAX_MESSAGES} more"]
                                           if len(errors) > MAX_MESSAGES else []))
    return outcome


def _figures(op, task, cases, sol_times, ref_times, record) -> None:
    sizes, ratios = [], []
    for case in cases:
        sol_jobs, ref_jobs = sol_times[case.id], ref_times[case.id]
        sol = summarize([t for job in sol_jobs for t in job])
        ref = summarize([t for job in ref_jobs for t in job])
        nbytes, factor = op.bytes(case.count, case.dtype, case.world, case.params)
        s = speedup(ref, sol)
        ratios.append(s)
        m = task.metric
        sizes.append({
            "count": case.count,
            "dtype": case.dtype,
            "bytes": nbytes,
            "t_sol_us": sol.median * 1e6,
            "t_ref_us": ref.median * 1e6,
            "spread_sol": sol.spread,
            "spread_ref": ref.spread,
            "n": sol.n,
            "metric": m.name,
            "unit": m.unit,
            "value_sol": metric_value(sol.median, nbytes, factor, m.bytes, m.unit),
            "value_ref": metric_value(ref.median, nbytes, factor, m.bytes, m.unit),
            "speedup": s,
            # each job's median, in the order the jobs ran: drift and job-to-job noise show here
            "jobs_sol_us": [float(np.median(j)) * 1e6 for j in sol_jobs],
            "jobs_ref_us": [float(np.median(j)) * 1e6 for j in ref_jobs],
        })
    record["sizes"] = sizes
    record["speedup"] = float(np.exp(np.mean(np.log(ratios)))) if ratios else None
