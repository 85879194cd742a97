"""Run one candidate of one task at one world size and decide its verdict.

This is the controller side of the trust boundary: it owns the secret seed, writes the inputs,
launches reference and solution jobs (interleaved, in separate processes), and judges what the
ranks wrote with the task's oracle. It never imports solution code.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import checks, cupti_guard, interposer, jobfiles, observer, regions, sandbox
from .build import ALWAYS_FORBIDDEN_C, expand_forbid, native_forbid
from .checks.base import Case, make_late
from .launch import Job, find_mpiexec, mpi_env
from .models.base import Candidate, Reply
from .platforms.base import Platform
from .rank import protocol
from .tasks import Task
from .timing import (
    HostLoad,
    interval90,
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
    contended_stop: bool = True  # no rounds past the minimum where the host is contended
    reps: int = 10  # minimum timed repetitions per size and job
    max_reps: int = 200  # ... and the most, while the time budget lasts
    budget_s: float = 0.25  # timed seconds per size and job the repetitions may add up to
    warmup: int = 2
    timeout: float | None = None  # overrides the manifest's per-job deadline
    keep: bool = False
    exclusive: bool = True  # timed items hold the whole node (GPU platforms)
    sandbox: bool = True  # jobs in namespaces (False: --commbench-unsandboxed)
    hide: tuple[Path, ...] = ()  # more trees no job may see (the runs root, the project)
    wall_s: float = 2.5  # seconds per case and job the observer may spend on repetitions
    refine_rounds: int = 1  # model generations per task at most (refinement rounds)
    budget_usd: float | None = None  # ... and none once the task's answers cost this much
    check_only: bool = False  # correctness only: no reference job, no timing
    gpu_batch: bool = False  # GPU jobs batch short calls too (--commbench-gpu-batch)


@dataclass
class Outcome:
    """What one job showed: failure (verdict, message, detail) or per-case max-over-ranks times."""

    verdict: Verdict
    message: str = ""
    detail: str = ""
    times: dict[str, list[observer.Timing]] = field(default_factory=dict)
    output: str = ""
    batches: dict[str, int] = field(default_factory=dict)  # calls per timed batch, per case
    seconds: float = 0.0


class InfraError(Exception):
    """The harness, the reference or the machine failed; not the solution's fault."""


def run_candidate(task: Task, world: int, candidate: Candidate, platform: Platform,
                  settings: Settings) -> dict[str, Any]:
    """Return the result record (without run-level fields) for one item. With refinement
    rounds (a model that can be asked again), a failure or a pass slower than the reference
    is fed back and the model answers again, up to `settings.refine_rounds` times; the
    record is the best passing round's (else the last), with every round's tokens and cost,
    the round that first passed and each round's verdict."""
    started = time.time()
    rounds = settings.refine_rounds if candidate.refine is not None else 1
    history: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    record: dict[str, Any] = {}
    tokens_in = tokens_out = 0
    cost = 0.0
    # what the answers cost, replayed ones included (`cost` counts an answer once per run,
    # in the item that got it first): the budget's measure, so that every world size of a
    # task, and a rerun from kept replies, stops at the round the asking run stopped at
    spent = 0.0
    requests: list[dict[str, Any]] = []
    replayed = False
    ended = candidate.ended(world) if candidate.ended is not None else None
    for rnd in range(1, rounds + 1):
        if rnd == 1:
            attempt = candidate
        else:
            feedback, previous = _feedback(record), record.get("_reply", "")
            attempt = Candidate(candidate.id, candidate.kind,
                                lambda r=rnd, f=feedback, p=previous: candidate.refine(r, p, f))
        record = _attempt(task, world, attempt, platform, settings)
        stop = None
        tokens_in += record["tokens_in"]
        tokens_out += record["tokens_out"]
        cost += record["cost"] or 0.0
        asked = record.get("requests") or []
        spent += (sum(float(q.get("cost") or 0.0) for q in asked) if asked
                  else record["cost"] or 0.0)
        requests += asked
        replayed = replayed or bool(record.get("replayed"))
        history.append({"round": rnd, "verdict": record["verdict"],
                        "speedup": record.get("speedup"), "message": record["message"][:300]})
        if record["verdict"] == "pass":
            if best is None or (record.get("speedup") or 0) > (best.get("speedup") or 0):
                best = record
            if record.get("speedup") is None or record["speedup"] >= 1.0:
                stop = "fast enough"
        elif record["verdict"] == "infra_error":
            break  # an outage or a broken reference: asking again would not help
        if stop is None and settings.budget_usd is not None and spent >= settings.budget_usd:
            stop = "budget"  # the task's budget is spent (the paper's cost-matched comparison)
        if stop is not None or rnd == ended:
            # an early end is kept with the replies: a rerun (whose timing may differ)
            # stops at the same round and asks nothing new
            if stop is not None and rnd < rounds and candidate.end is not None:
                candidate.end(world, rnd)
            break
    final = best or record
    final.pop("_reply", None)
    final.pop("_imprecise", None)
    final.update(tokens_in=tokens_in, tokens_out=tokens_out, cost=cost, requests=requests,
                 replayed=replayed, rounds=len(history),
                 duration_s=round(time.time() - started, 3))
    if candidate.refine is not None:
        first = next((h["round"] for h in history if h["verdict"] == "pass"), None)
        final.update(round=first, round_history=history)
    return final


def _feedback(record: dict[str, Any]) -> str:
    """What the next round is told about the last: the verdict and its evidence, or the
    per-size speedups of a pass. Never anything of the reference or the seed."""
    if record["verdict"] == "pass":
        sizes = ", ".join(f"count {s['count']}: {s['speedup']:.2f}x" for s in record["sizes"]
                          if s.get("speedup") is not None)
        return (f"verdict: pass, but slower than the expert solution: speedup "
                f"{record.get('speedup') or 0:.3f} overall ({sizes}). Make it faster, "
                "keeping it correct.")
    parts = [f"verdict: {record['verdict']}", record["message"]]
    if record.get("detail"):
        parts.append(record["detail"][-3000:])
    if record.get("output"):
        parts.append("output (tail):\n" + record["output"][-2000:])
    return "\n".join(p for p in parts if p)


def _attempt(task: Task, world: int, candidate: Candidate, platform: Platform,
             settings: Settings) -> dict[str, Any]:
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
        message, _, detail = str(exc).partition("\n")  # the evidence, where any, after a line
        record.update(verdict=Verdict.INFRA_ERROR, message=message, detail=detail)
    except Exception as exc:  # noqa: BLE001 - a harness bug is an infra_error, never a crash
        record.update(verdict=Verdict.INFRA_ERROR,
                      message=f"harness error: {exc.__class__.__name__}: {exc}",
                      detail=traceback.format_exc())
    record["verdict"] = str(record["verdict"])
    record["duration_s"] = round(time.time() - started, 3)
    if not settings.keep:
        _tidy(settings.work, everything=record["verdict"] == "pass")
    return record


def _tidy(work: Path, everything: bool, seconds: float = 30.0) -> None:
    """Free the disk, in at most `seconds`: a passing item leaves nothing; a failing one
    keeps the evidence a human looks at and nothing else its solution wrote. Kept: the
    solution's source (`solution.<ext>`), and in each job's folder its output log (as the
    job left it, its first MiB and its tail; its last 2 MiB if it grew past that), its job
    file (`ro/job.json`) and its ranks' status, stack and guard files (and the MPS state)
    under `out/` (64 KiB each); removed: scratch folders, data, copies of the code and
    libraries, anything else. Nothing is followed: a link, FIFO or device is
    removed, never opened; a kept file is opened without following links and only if it is
    a regular file; folders are walked from descriptors, a few at a time (deeper ones are
    moved up first), so a deep or huge tree costs time, never more than `seconds`."""
    import os
    import re as regex
    import stat

    deadline = time.monotonic() + seconds
    folder_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    evidence = regex.compile(protocol.EVIDENCE)
    solution = regex.compile(r"solution\.(py|cu|cpp|c)")

    def kind(dir_fd: int, name: str) -> int | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return None

    def opened(dir_fd: int, name: str) -> int | None:
        """A descriptor of the folder `name` (made readable if its solution closed it)."""
        for attempt in range(2):
            try:
                return os.open(name, folder_flags, dir_fd=dir_fd)
            except PermissionError:
                if attempt == 0:
                    try:
                        os.chmod(name, 0o700, dir_fd=dir_fd)
                    except OSError:
                        return None
            except OSError:
                return None
        return None

    def purge(dir_fd: int, name: str) -> None:
        """Remove `name` of the folder open at `dir_fd`, with everything under it."""
        mode = kind(dir_fd, name)
        if mode is None:
            return
        if not stat.S_ISDIR(mode):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
            return
        top = opened(dir_fd, name)
        if top is None:
            return
        stack = [(top, name, os.listdir(top))]  # (descriptor, name in its parent, to do)
        moved = 0
        try:
            while stack:
                if time.monotonic() > deadline:
                    return
                fd, own, todo = stack[-1]
                if not todo:
                    # emptied (or what is left could not go): remove it from its parent
                    stack.pop()
                    os.close(fd)
                    try:
                        os.rmdir(own, dir_fd=stack[-1][0] if stack else dir_fd)
                    except OSError:
                        pass
                    continue
                entry = todo.pop()
                mode = kind(fd, entry)
                if mode is None:
                    continue
                if not stat.S_ISDIR(mode):
                    try:
                        os.unlink(entry, dir_fd=fd)
                    except OSError:
                        pass
                    continue
                if len(stack) >= 16:  # few descriptors at once: a deep folder moves up
                    moved += 1
                    fresh = f".tidy-{moved}"
                    try:
                        os.rename(entry, fresh, src_dir_fd=fd, dst_dir_fd=top)
                        stack[0][2].append(fresh)
                    except OSError:
                        pass
                    continue
                sub = opened(fd, entry)
                if sub is not None:
                    try:
                        stack.append((sub, entry, os.listdir(sub)))
                    except OSError:
                        os.close(sub)
        finally:
            for fd, _own, _todo in stack:
                os.close(fd)

    def cap(dir_fd: int, name: str, limit: int) -> None:
        """Keep `name` if it is a regular file, cut to its last `limit` bytes; else remove."""
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError:
            purge(dir_fd, name)
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                fd = -1
                purge(dir_fd, name)
                return
            if info.st_size > limit:
                note = f"[... {info.st_size - limit} bytes cut when the item was tidied ...]\n"
                tail = os.pread(fd, limit, info.st_size - limit)
                os.ftruncate(fd, 0)
                os.pwrite(fd, note.encode() + tail, 0)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def keep_only(dir_fd: int, name: str, keep) -> None:
        """In the folder `name`: `keep(entry)` says the cap of a file kept, None: removed."""
        if kind(dir_fd, name) is None or not stat.S_ISDIR(kind(dir_fd, name)):
            purge(dir_fd, name)
            return
        fd = opened(dir_fd, name)
        if fd is None:
            return
        try:
            for entry in os.listdir(fd):
                if time.monotonic() > deadline:
                    return
                limit = keep(entry)
                if limit is None:
                    purge(fd, entry)
                elif isinstance(limit, int):
                    cap(fd, entry, limit)
                else:
                    keep_only(fd, entry, limit)
        except OSError:
            pass
        finally:
            os.close(fd)

    def in_out(entry: str) -> int | None:
        return 64 << 10 if evidence.fullmatch(entry) else None

    def in_ro(entry: str) -> int | None:
        return 1 << 20 if entry == "job.json" else None

    def in_job(entry: str):
        return {"output.log": 2 << 20, "out": in_out, "ro": in_ro}.get(entry)

    def in_work(entry: str):
        return 4 << 20 if solution.fullmatch(entry) else in_job

    try:
        parent = os.open(work.parent, folder_flags)
    except OSError:
        return
    try:
        if everything:
            purge(parent, work.name)
        else:
            keep_only(parent, work.name, in_work)
    finally:
        os.close(parent)


def _produce(candidate: Candidate) -> Reply:
    try:
        return candidate.produce()
    except Exception as exc:  # noqa: BLE001 - a model source that fails is an outage
        return Reply(None, infra_error=f"{exc.__class__.__name__}: {exc}")


def _run(task, world, candidate, platform, settings, record) -> None:
    reply = _produce(candidate)
    record.update(tokens_in=reply.tokens_in, tokens_out=reply.tokens_out, cost=reply.cost,
                  rounds=reply.rounds, _reply=reply.text or "",
                  # the request behind the answer (endpoint, settings, usage, its cost and
                  # price source), and whether the answer was kept from before, not asked
                  requests=[reply.request] if reply.request else [], replayed=reply.replayed)
    if (reply.request or {}).get("price"):
        record["price_source"] = reply.request["price"]
    if reply.infra_error:
        raise InfraError(f"the model source failed: {reply.infra_error}")
    if reply.truncated:  # the model's failure, judged as it is: neither built nor run
        limit = (reply.request or {}).get("max_tokens") or reply.tokens_out
        raise Rejected(Verdict.TRUNCATED,
                       f"the reply was cut at the output limit ({limit} tokens): raise "
                       "--commbench-max-tokens or the model's max_tokens")
    template = task.template.read_text(encoding="utf-8")
    solution = regions.merge_reply(template, reply.text)
    settings.work.mkdir(parents=True, exist_ok=True)
    (settings.work / f"solution{task.suffix}").write_text(solution)
    artifact = platform.build(task, solution, settings.cache)

    timed = candidate.kind == "solution" and not settings.check_only
    if candidate.kind == "solution" and settings.check_only:
        record["check_only"] = True
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
                                      task.check.trials, 0))
            if task.check.late_rank:
                make_late(cases[-1], rng, len(cases) - 1)
    if settings.sandbox and sandbox.probe():
        raise InfraError(f"no job sandbox on this machine ({sandbox.probe()}); "
                         "--commbench-unsandboxed runs without one")
    plan = Plan(task, world, platform, settings, op, cases, settings.timeout or task.timeout)
    artifacts = {"ref": ref_artifact.path, "sol": artifact.path} if timed else {"sol": artifact.path}
    with platform.lease(world, exclusive=timed and settings.exclusive) as lease_env:
        times, output = _interleave(plan, artifacts, lease_env, record)
    record["output"] = output[-OUTPUT_IN_RECORD:]
    record["verdict"] = Verdict.PASS
    if timed and settings.reps > 0:
        _figures(op, task, cases, times["sol"], times["ref"], record)
        for case, size in zip(cases, record["sizes"]):
            size["batch"] = plan.batches.get(case.id, 1)
        _trust(record)
        if getattr(platform, "shared", lambda _w: False)(world):
            # ranks shared a GPU: the speedup compares two programs time-sliced or under MPS
            # on one device, not what either does over NVLink; never banded
            record["timing_trust"] = "shared"


def _trust(record: dict[str, Any]) -> None:
    """How far the speedup may be read: its 90% interval, and `timing_trust`: `contended`
    (the item's ranks and the load from outside it needed more CPUs than there were),
    `noisy` (the precision asked for was not reached in the timing rounds allowed), else
    `ok`. Bands are only given to trusted speedups whose interval lies inside one band."""
    jobs = min((min(len(s["jobs_sol_us"]), len(s["jobs_ref_us"])) for s in record["sizes"]),
               default=0)
    record["speedup_ci90"] = interval90(record["speedup"], record.get("speedup_se"), jobs)
    load = record.get("host_load") or {}
    record["timing_trust"] = ("contended" if load.get("contended") else
                              "noisy" if record.pop("_imprecise", True) else "ok")


@dataclass
class Plan:
    """What every job of one item shares."""

    task: Task
    world: int
    platform: Platform
    settings: Settings
    op: checks.Op
    cases: list[Case]
    deadline: float
    # calls per timed batch, per case: chosen by the item's warm-up job, then the same for
    # every reference and solution job
    batches: dict[str, int] = field(default_factory=dict)


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
    baseline: dict[str, tuple[float, float] | None] = {}
    phases: dict[str, dict[str, list[list[float]]]] = {}
    if timed:
        # the solution's correctness first, untimed (its trials and a few checked calls): a
        # wrong answer is known before any reference job is spent on it
        outcome = _run_job(plan, artifacts["sol"], settings.work / "check", lease_env, False)
        if outcome.verdict is not Verdict.PASS:
            record["output"] = outcome.output[-OUTPUT_IN_RECORD:]
            raise Rejected(outcome.verdict, outcome.message, outcome.detail)
        # a warm-up job of the reference, timed like the others, its times thrown away:
        # whatever the first job of an item pays (page cache, input files being written back,
        # cold imports, devices waking from idle) is paid here; on 2x H200 the first timed
        # job of an item was often the slowest of all, and with ABBA it is always a
        # reference job, so without this the solution looked a few per cent faster
        job_dir = settings.work / "warmup"
        outcome = _run_job(plan, artifacts["ref"], job_dir, lease_env, timed, trials=False)
        if outcome.verdict is not Verdict.PASS:
            raise InfraError(_reference_failed(outcome))
        # what the harness's own upload and fetch take, per case: beyond it, the untimed
        # phases are charged to every later job, the reference's as well (observer.charged)
        baseline = {cid: observer.phase_baseline(ts) for cid, ts in outcome.times.items()}
        plan.batches.update(outcome.batches)
    load = HostLoad()
    load.start()
    rounds = settings.rounds if timed else 1
    most = max(rounds, settings.max_rounds) if timed and settings.reps > 0 else rounds
    rnd = 0
    contended = False

    def more() -> bool:
        """Another round past the minimum: while the speedup is imprecise, unless the host
        is contended (more CPUs busy than there are: no number of rounds makes that timing
        readable, so none are paid for; the summary says the speedup is not to be read)."""
        nonlocal contended
        if rnd >= most or not _imprecise(times, plan, record):
            return False
        if not settings.contended_stop:
            return True
        contended = bool(load.stop(plan.world)["contended"])
        return not contended

    while rnd < rounds or more():
        for who in (order if rnd % 2 == 0 else order[::-1]):
            job_dir = settings.work / f"{who}{rnd}"
            # the reference's jobs time and check fresh inputs, but skip the trials (only
            # the solution's correctness is in question, and they cost the large sizes most)
            outcome = _run_job(plan, artifacts[who], job_dir, lease_env, timed,
                               trials=who == "sol")
            if outcome.verdict is not Verdict.PASS:
                if who == "ref":
                    raise InfraError(_reference_failed(outcome))
                record["output"] = outcome.output[-OUTPUT_IN_RECORD:]
                raise Rejected(outcome.verdict, outcome.message, outcome.detail)
            if who == "sol":
                output = outcome.output
            for cid, ts in outcome.times.items():
                times[who][cid].append(observer.charged(ts, baseline.get(cid)))
                if timed and ts and plan.platform.backend != "cpu":
                    # per case and job, the medians of the untimed phases (microseconds):
                    # the evidence behind any charge, and where a slow harness copy shows
                    phases.setdefault(cid, {}).setdefault(who, []).append(
                        [round(float(np.median([t.before for t in ts])) * 1e6, 1),
                         round(float(np.median([t.after for t in ts])) * 1e6, 1)])
        rnd += 1
    if phases:
        record["untimed_phases_us"] = {
            cid: {"baseline": [round(b * 1e6, 1) for b in baseline[cid]]
                  if baseline.get(cid) else None, **per_role}
            for cid, per_role in phases.items()}
    if timed:
        record["timing_rounds"] = rnd
        if contended:
            record["timing_stopped"] = "contended"
        record["_imprecise"] = _imprecise(times, plan, record)
        # every rank keeps a CPU busy (MPI progress, a spinning device synchronize)
        record["host_load"] = load.stop(plan.world)
    return times, output


def _reference_failed(outcome: Outcome) -> str:
    """The message of an item whose reference failed, with the evidence (a hung reference's
    ranks and stacks, a wrong answer's other messages)."""
    text = f"the reference failed ({outcome.verdict}): {outcome.message}"
    return f"{text}\n{outcome.detail[-4000:]}" if outcome.detail else text


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


RANK_CODE = Path(__file__).parent / "rank"


def _stage(job_dir: Path, artifact: Path) -> tuple[Path, Path]:
    """The job's read-only part: its own copy of the rank code and of the built solution
    (the package and the build cache are not visible in the sandbox)."""
    code = job_dir / "ro" / "code" / "commbench_rank"
    code.mkdir(parents=True)
    for src in RANK_CODE.glob("*.py"):
        shutil.copyfile(src, code / src.name)
    solution = job_dir / "ro" / artifact.name
    shutil.copyfile(artifact, solution)
    return code.parent, solution


def _hidden(settings: Settings) -> list[Path]:
    """What a job must not see: the references and the project around them, the build
    cache, every item's and run's files (the job's own folder is brought back)."""
    trees = [settings.references, settings.references.parent, settings.cache,
             settings.work.parent, *settings.hide]
    return [t for t in trees if t and Path(t).resolve() != Path("/")]


def _interposer(task: Task, settings: Settings) -> Path | None:
    """The preloaded library that ends a rank calling what the task forbids (None where the
    task forbids nothing or the machine cannot build it)."""
    uses = {task.library, *task.requires}
    libs = interposer.default_libraries(find_mpiexec(), nccl=bool(uses & {"nccl", "nccl-device"}),
                                        nvshmem="nvshmem" in uses)
    patterns = tuple(dict.fromkeys((*expand_forbid(task.forbid), *ALWAYS_FORBIDDEN_C)))
    # a compiled solution cannot call mpi4py (the Python C API is forbidden to it): MPI calls
    # from mpi4py's extension are the harness's own (its host helpers, its own set-up)
    trusted = interposer.mpi4py_folders() if task.language == "cuda" else ()
    return interposer.build_interposer(patterns, libs, settings.cache / "guard", trusted)


def _cupti_guard(task: Task, settings: Settings) -> Path | None:
    """The library each rank of a CUDA task arms before loading the solution: a CUDA runtime
    or driver function the task forbids, called from the solution's code however its address
    was found, ends the rank (None where the task forbids none or CUPTI is missing)."""
    if task.language != "cuda" or not task.forbid:
        return None
    patterns = native_forbid(expand_forbid(task.forbid))
    return cupti_guard.build_cupti_guard(
        patterns, settings.cache / "cupti",
        trusted=cupti_guard.trusted_for({task.library, *task.requires}))


def _job_seed(seed: int, job_dir: Path) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{job_dir.name}".encode()).digest()[:8],
                          "little")


def _run_job(plan: Plan, artifact: Path, job_dir: Path, lease_env: dict[str, str],
             timed: bool, trials: bool = True) -> Outcome:
    task, world, platform, settings = plan.task, plan.world, plan.platform, plan.settings
    if job_dir.exists():
        shutil.rmtree(job_dir)
    out, scratch = job_dir / "out", job_dir / "scratch"
    out.mkdir(parents=True)
    scratch.mkdir()
    code, solution = _stage(job_dir, artifact)
    libs = getattr(platform, "nccl_lib", lambda: None)()
    spec = {
        "solution": str(solution), "entry": task.entry, "language": task.language,
        "fixtures": list(task.fixtures), "workspace_bytes": task.workspace,
        "backend": platform.backend, "out": str(out), "scratch": str(scratch),
        "job_dir": str(job_dir.resolve()), "nccl_lib": libs, "deadline_s": plan.deadline,
        "ranks_per_gpu": getattr(platform, "ranks_per_gpu", 1),
        "cases": [{"id": c.id, "args": c.args, "params": c.params} for c in plan.cases],
    }
    job_file = job_dir / "ro" / "job.json"
    job_file.write_text(json.dumps(spec))
    env = {**mpi_env(), **platform.env(), **lease_env, "PYTHONPATH": str(code),
           protocol.ENV_GUARD_REPORT: str(out / protocol.GUARD_REPORT), "TMPDIR": "/tmp",
           # compile caches of the job's own (a shared one could carry a solution's kernels
           # into the reference's jobs); the rest of the filesystem is read-only
           "CUPY_CACHE_DIR": str(scratch / ".cupy"), "CUDA_CACHE_PATH": str(scratch / ".nv")}
    preload = _interposer(task, settings)
    if preload is not None:
        staged = job_dir / "ro" / preload.name
        shutil.copyfile(preload, staged)
        env["LD_PRELOAD"] = ":".join(p for p in (str(staged), env.get("LD_PRELOAD")) if p)
    watch = _cupti_guard(task, settings)
    if watch is not None:  # loaded and armed by each rank, before the solution
        staged = job_dir / "ro" / watch.name
        shutil.copyfile(watch, staged)
        env[cupti_guard.GUARD_ENV] = str(staged)
    argv = platform.launch_argv(world, job_file)
    if settings.sandbox:
        argv = sandbox.wrap(job_dir, argv, env, hide=_hidden(settings))
    obs_settings = observer.Settings(
        reps=settings.reps, max_reps=settings.max_reps, budget_s=settings.budget_s,
        warmup=settings.warmup, wall_s=settings.wall_s, rtol=task.check.rtol,
        atol=task.check.atol)
    rng = np.random.default_rng(_job_seed(settings.seed, job_dir))
    # batches of calls: Python solutions on the host backend; on a GPU (a device buffer set,
    # a compiled solution's context and its IPC mappings per call) where asked for
    batch = (task.language == "python" if platform.backend == "cpu" else settings.gpu_batch)
    obs = observer.Observer(job_dir, world, plan.op, obs_settings, rng,
                            staged=platform.backend != "cpu", timed=timed, trials=trials,
                            batch=batch,
                            batches=dict(plan.batches) if plan.batches else None)
    outcome = Outcome(Verdict.PASS)
    failure: Exception | None = None
    job = Job(argv, job_dir, plan.deadline, env=env)
    try:
        obs.connect(job)
        for index, case in enumerate(plan.cases, start=1):
            outcome.times[case.id] = obs.run_case(case)
            obs.end(index)
        job.end = min(job.end, time.monotonic() + END_GRACE_S)
        job.wait()
        if job.alive() or job.proc.returncode != 0:
            raise observer.JobEnded(Verdict.RUNTIME_ERROR, "the ranks did not end cleanly "
                                                           "after their last call")
    except observer.WrongAnswer as exc:
        outcome.verdict = Verdict.WRONG_ANSWER
        outcome.message = exc.errors[0]
        more = exc.errors[1:MAX_MESSAGES]
        outcome.detail = "\n".join(more + ([f"... {len(exc.errors) - MAX_MESSAGES} more"]
                                           if len(exc.errors) > MAX_MESSAGES else []))
    except observer.JobEnded as exc:
        outcome.verdict, outcome.message, outcome.detail = exc.verdict, exc.message, exc.detail
    except Exception as exc:  # judged below, once every rank's last words are read
        failure = exc
    finally:
        obs.end(len(plan.cases))
        result = job.finish()
        try:
            # whether a rank began to load the solution decides who is to blame: read all
            # the ranks said before the job ended, not only what the observer had read
            obs.settle()
        finally:
            obs.close()
            if not settings.sandbox:  # a sandbox's daemons die with it; here one may be left
                getattr(platform, "reap", lambda _out: None)(out)
    if failure is not None:
        # after a rank began to load the solution, whatever made the observer fail came
        # through the solution's reach (its outputs, its messages, its processes): its fault
        if not obs.loaded:
            raise failure
        outcome.verdict = Verdict.RUNTIME_ERROR
        outcome.message = (f"the job made the observer fail ({type(failure).__name__}: "
                           f"{str(failure)[:300]})")
    elif outcome.verdict is Verdict.INFRA_ERROR and obs.loaded:
        # the observer said "not loaded yet" before it had read every rank's word: a rank
        # had begun to load the solution, so the job's end is the solution's
        outcome.verdict = Verdict.TIMEOUT if result.timed_out else Verdict.RUNTIME_ERROR
        outcome.message = (f"the job did not finish within {plan.deadline:g} s and was killed"
                           if result.timed_out else "the job ended early")
    outcome.output, outcome.seconds = result.output, result.seconds
    outcome.batches = obs.batches
    if outcome.verdict is Verdict.RUNTIME_ERROR and settings.sandbox:
        _killed_outside(result)
    if outcome.verdict in (Verdict.RUNTIME_ERROR, Verdict.TIMEOUT):
        _blame(outcome, result, out, world, obs.loaded)
    return outcome


def _killed_outside(result) -> None:
    """Raise InfraError where the job was killed from outside it: its first process (the
    sandbox's `unshare`, the controller's own child) died of a signal while the controller
    had sent none (`JobResult.killed` is the controller's record). Nothing inside the job can
    send `unshare` a signal: it lies outside the job's PID namespace, and no process of the
    job shares its process group (the launcher runs in a session of its own); the job's
    namespace init (which `unshare` mirrors) takes no signal from inside either. What is left
    is the machine's: someone outside, the kernel (the OOM killer)."""
    code = result.returncode
    if result.killed or code is None or code >= 0:
        return
    import signal

    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    raise InfraError(f"the job was killed from outside: its sandbox's first process ended by "
                     f"signal {-code}{name}, which the controller did not send and no process "
                     f"of the job can\n{result.output.strip()[-800:]}")


def _stacks(out: Path, world: int) -> str:
    """The Python stacks a hung rank's watchdog wrote shortly before the deadline (quoted for
    whoever debugs the hang, never believed; read as `jobfiles` reads a job's files)."""
    parts = []
    for rank in range(world):
        data = jobfiles.read(out.parent, f"{out.name}/{protocol.stack_file(rank)}", 65536,
                             tail=True)
        text = data.decode(errors="replace").strip() if data else ""
        if text:
            parts.append(f"rank {rank}'s Python stack near the deadline:\n{text[-1500:]}")
    return "\n".join(parts)


END_GRACE_S = 30.0
LIMIT_LINE = re.compile(r"\[commbench sandbox\] stopped the job: ([^\n]*)")
# Open MPI 5's report of a rank that ended without MPI_Finalize (os._exit, exit())
IMPROPER = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+\S+\s+"
                      r"exiting\s+improperly")
EXITED = re.compile(r"(?:rank|Process name: \[\[?[^\]]*?,)\s*(\d+)\]?.*?"
                    r"(?:exit(?:ed)?(?: with)?(?: non-zero)? (?:status|code)[:\s]+(\d+))",
                    re.S)


def _blame(outcome: Outcome, result, out: Path, world: int, loaded: bool) -> None:
    """Who ended the job: before any rank said it was loading the solution, the harness or
    the machine (whatever the job's exit code, output or files say: nothing of the solution
    had run); afterwards a forbidden call (the guard's report), a rank that raised or died,
    always the solution."""
    if not loaded:
        # an exit code is evidence of the harness's failure only before any rank began to
        # load the solution: afterwards the solution can end its rank with any code it likes
        if result.returncode == protocol.RESOLVE_EXIT:
            raise InfraError("the run-time guard does not fit the MPI the ranks loaded: "
                             f"{result.output.strip()[-800:]}")
        raise InfraError(f"the job failed before the solution was loaded ({outcome.message}): "
                         f"{result.output.strip()[-800:] or 'no output'}")
    reports = observer.guard_reports(out, world)
    if reports:
        outcome.verdict = Verdict.FORBIDDEN
        what = reports[0].get("forbidden", "?")
        outcome.message = f"the solution called what this task forbids, at run time: {what}"
        outcome.detail = str(reports[0].get("detail", ""))[:2000]
        return
    if result.returncode == protocol.LIMIT_EXIT:
        # the sandbox stopped the job at one of its limits (processes, its folder's size, the
        # disk): the solution's failure; the sandbox's line says which (a solution printing
        # such a line changes only this message, never the verdict)
        said = LIMIT_LINE.findall(result.output)
        outcome.message = ("the job went past a limit of its sandbox and was stopped"
                           + (f": {said[-1].strip()[:500]}" if said else
                              f" (exit code {protocol.LIMIT_EXIT})"))
        return
    statuses = []
    for rank in range(world):
        # written by the rank's process: quoted, bounded, never trusted
        data = jobfiles.read(out.parent, f"{out.name}/{protocol.status_file(rank)}", 65536)
        try:
            status = json.loads(data) if data else None
        except Exception:  # noqa: BLE001
            status = None
        statuses.append(status if isinstance(status, dict) else None)
    if outcome.verdict is Verdict.TIMEOUT:
        stuck = [f"rank {r}: {str(s.get('phase'))[:100]}" for r, s in enumerate(statuses)
                 if isinstance(s, dict) and not s.get("done")]
        raised = [(r, s) for r, s in enumerate(statuses) if isinstance(s, dict) and s.get("error")]
        if raised:
            # a rank that raised and then hung in its abort (MPI_Abort can hang): its
            # exception is what tells; the verdict stays the timeout the observer saw
            rank, s = raised[0]
            outcome.message += (f"; rank {rank} had raised during {str(s.get('phase'))[:100]} "
                                f"(as its own status file says) and the job did not end after "
                                f"it: {str(s['error'])[:1500]}")
        outcome.detail = "\n".join(
            p for p in (outcome.detail, "status files: " + "; ".join(stuck) if stuck else "",
                        str(raised[0][1].get("traceback", ""))[-4000:] if raised else "",
                        _stacks(out, world)) if p)
        return
    for rank, s in enumerate(statuses):
        if isinstance(s, dict) and s.get("error"):
            outcome.message = (f"rank {rank} raised during {str(s.get('phase'))[:100]} (as its "
                               f"own status file says): {str(s['error'])[:1500]}")
            outcome.detail = str(s.get("traceback", ""))[-6000:]
            return
    seen = LAUNCHER_DEATH.search(result.output)
    if seen:
        how = f"signal {seen.group(2)}{f' ({seen.group(3)})' if seen.group(3) else ''}"
        outcome.message = f"rank {seen.group(1)} died ({how}): {outcome.message}"
        return
    seen = IMPROPER.search(result.output)
    if seen:
        outcome.message = (f"rank {seen.group(1)} died (it left without finalizing MPI, e.g. "
                           f"os._exit): {outcome.message}")
        return
    seen = EXITED.search(result.output)
    if seen:
        outcome.message = f"rank {seen.group(1)} exited with code {seen.group(2)}: " \
                          f"{outcome.message}"
        return
    outcome.message += f" (launcher exit code {result.returncode})"


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
