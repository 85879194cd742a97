"""One attempt of one item: the answer (a reply as a value, or a candidate's, produced here)
merged into the template, built, run (checked, and timed against the reference unless
check-only) and judged. `evaluate` is the engine's one entry; refinement and agents call it
once per answer."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from .. import build, checks, regions, sandbox
from ..checks.base import make_late
from ..models.base import Candidate, Reply
from ..platforms.base import Platform
from ..record import Usage, request_limit, request_price
from ..settings import Settings
from ..tasks import Task
from ..verdicts import Rejected, Verdict
from .job import compile_jail, run_job
from .measure import OUTPUT_IN_RECORD, blurred_by_skew, figures, measure, trust
from .plan import InfraError, JobRunner, Plan
from .result import ItemResult
from .tidy import tidy


def evaluate(task: Task, world: int, answer: Reply | Candidate, platform: Platform,
             settings: Settings, runner: JobRunner | None = None, *,
             kind: str | None = None) -> ItemResult:
    """The verdict (and, timed, the speedup) of an answer: never raises; a failure of the
    harness, the reference or the model source is an `infra_error`. `answer` is the reply as
    a value (`kind`: "solution", the default, must pass and is timed; "mutant" must be
    rejected), or a candidate whose answer is produced here (its kind, unless `kind` says).
    Its jobs run with `runner`, else the settings' (`Settings.runner`), else `run_job`."""
    started = time.time()
    runner = runner or settings.runner or run_job
    if isinstance(answer, Candidate):
        kind = kind or answer.kind
        answer = produce(answer.produce)
    # the attempt as it is learnt (the typed result is made once, at the end); a
    # compile-only run's answers, built or not, are never scored (scoring.scored)
    draft = SimpleNamespace(verdict="", compile_only=settings.compile_only or None, hosts=None,
                            clock_skew_us=None)
    try:
        _run(task, world, answer, kind or "solution", platform, settings, draft, runner)
    except Rejected as exc:
        draft.verdict, draft.message, draft.detail = exc.verdict, exc.message, exc.detail
        draft.output = exc.output or getattr(draft, "output", "")
    except InfraError as exc:
        message, _, detail = str(exc).partition("\n")  # the evidence, where any, after a line
        draft.verdict, draft.message, draft.detail = Verdict.INFRA_ERROR, message, detail
    except Exception as exc:  # noqa: BLE001 - a harness bug is an infra_error, never a crash
        draft.verdict = Verdict.INFRA_ERROR
        draft.message = f"harness error: {exc.__class__.__name__}: {exc}"
        draft.detail = traceback.format_exc()
    draft.verdict = str(draft.verdict)
    draft.duration_s = round(time.time() - started, 3)
    result = ItemResult(**vars(draft))
    if not settings.keep:
        tidy(settings.work, everything=result.passed)
    return result


def produce(make: Callable[[], Reply]) -> Reply:
    """The reply `make` gives; a model source that raises is an outage (`infra_error`)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - a model source that fails is an outage
        return Reply(None, infra_error=f"{exc.__class__.__name__}: {exc}")


def _run(task: Task, world: int, reply: Reply, kind: str, platform: Platform,
         settings: Settings, result: SimpleNamespace, runner: JobRunner) -> None:
    # the request behind the answer (endpoint, settings, usage, its cost and price source),
    # and whether the answer was kept from before, not asked
    result.usage = Usage(tokens_in=reply.tokens_in, tokens_out=reply.tokens_out, cost=reply.cost,
                         requests=(reply.request,) if reply.request else (),
                         replayed=reply.replayed, price_source=request_price(reply.request))
    result.rounds, result.reply_text = reply.rounds, reply.text or ""
    if reply.infra_error:
        raise InfraError(f"the model source failed: {reply.infra_error}")
    if reply.truncated:  # the model's failure, judged as it is: neither built nor run
        limit = request_limit(reply.request) or reply.tokens_out
        raise Rejected(Verdict.TRUNCATED,
                       f"the reply was cut at the output limit ({limit} tokens): raise "
                       "--commbench-max-tokens or the model's max_tokens")
    template = task.template.read_text(encoding="utf-8")
    solution = regions.merge_reply(template, reply.text)
    settings.work.mkdir(parents=True, exist_ok=True)
    (settings.work / f"solution{task.suffix}").write_text(solution)
    if not settings.unsandboxed and sandbox.probe():
        raise InfraError(f"no job sandbox on this machine ({sandbox.probe()}); "
                         "--commbench-unsandboxed runs without one")
    with build.jailed(compile_jail(settings)):  # the answer's compilers never see the references
        artifact = platform.build(task, solution, settings.cache)
    if settings.compile_only:
        result.verdict = Verdict.PASS
        result.message = f"built for {platform.label} " \
                         "(compile only: not run)"
        return

    timed = kind == "solution" and not settings.check_only
    if kind == "solution" and settings.check_only:
        result.check_only = True
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
    artifacts = {"ref": ref_artifact.path, "sol": artifact.path} if timed else {"sol": artifact.path}
    layout = platform.layout(task, world)

    def noting(plan: Plan, *args, **kwargs):
        """The job runner, noting where the item's first job that reached the observer
        ran: each rank's host goes into the item's result."""
        outcome = runner(plan, *args, **kwargs)
        if result.hosts is None and outcome.hosts and any(outcome.hosts):
            result.hosts = list(outcome.hosts)
        if result.clock_skew_us is None and outcome.clock_skew_us:
            result.clock_skew_us = dict(outcome.clock_skew_us)
        return outcome

    with platform.lease(world, exclusive=timed and not settings.shared_node,
                        whole=timed) as lease_env:
        plan = Plan(task, world, platform, settings, op, cases, settings.timeout or task.timeout,
                    lease_env=lease_env, nodes=layout)
        measured = measure(plan, artifacts, noting)
    result.output = measured.output[-OUTPUT_IN_RECORD:]
    result.verdict = Verdict.PASS
    if measured.untimed_phases_us:
        result.untimed_phases_us = measured.untimed_phases_us
    if not timed:
        return
    result.timing_rounds = measured.rounds
    result.job_phases_s = measured.job_phases_s
    result.timing_stopped = measured.stopped
    result.host_load = measured.host_load
    result.imprecise = measured.imprecise
    if measured.compared:
        result.speedup_se = measured.speedup_se
    if settings.reps > 0:
        result.sizes, result.speedup = figures(plan, measured)
        shared = platform.shared(world)
        result.speedup_ci90, result.timing_trust = trust(result.sizes, result.speedup,
                                                         measured, shared)
        if result.timing_trust == "ok" and blurred_by_skew(result.sizes, result.clock_skew_us):
            result.timing_trust = "noisy"
