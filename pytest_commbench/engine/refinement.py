"""Direct prompting with refinement, a strategy over `evaluate`: the model's answer is
evaluated; a failure, or a pass whose timing shows it slower than the reference, is fed back
and the model answers again, up to `settings.rounds` times (a model that cannot be asked
again answers once). A pass whose speedup cannot be read (contended, shared or inconclusive
timing) ends the rounds: a paid "make it faster" round on a number that says nothing would
only double the task's cost."""

from __future__ import annotations

import time
from dataclasses import replace

from ..models.base import Candidate
from ..platforms.base import Platform
from ..record import Round
from ..scoring import INCONCLUSIVE, band
from ..settings import Settings
from ..tasks import Task
from ..verdicts import Verdict
from .flow import evaluate, produce
from .plan import JobRunner
from .result import ItemResult, Usage, first_pass


def refine(task: Task, world: int, candidate: Candidate, platform: Platform,
           settings: Settings, runner: JobRunner | None = None) -> ItemResult:
    """The item's result: the best passing round's (else the last's), with every round's
    tokens and cost, the round that first passed and each round's verdict."""
    started = time.time()
    conversation = candidate.conversation
    rounds = settings.rounds if conversation is not None else 1
    history: list[Round] = []
    best: ItemResult | None = None
    result: ItemResult | None = None
    usage = Usage()
    ended = conversation.ended(world) if conversation is not None else None
    for rnd in range(1, rounds + 1):
        if result is None:  # the first round
            answer = produce(candidate.produce)
        else:
            told, previous = feedback(result), result.reply_text
            answer = produce(lambda r=rnd, f=told, p=previous: conversation.again(r, p, f))
        result = evaluate(task, world, answer, platform, settings, runner, kind=candidate.kind)
        stop = None
        usage.add_usage(result.usage)
        history.append(Round(round=rnd, verdict=result.verdict, speedup=result.speedup,
                             message=result.message[:300]))
        if result.passed:
            if best is None or (result.speedup or 0) > (best.speedup or 0):
                best = result
            if not wants_speed(result):
                stop = "passed"
        elif result.verdict == Verdict.INFRA_ERROR:
            break  # an outage or a broken reference: asking again would not help
        if stop is None and settings.budget_usd is not None and usage.spent >= settings.budget_usd:
            stop = "budget"  # the task's budget is spent (the paper's cost-matched comparison)
        if stop is not None or rnd == ended:
            # an early end is kept with the replies: a rerun (whose timing may differ)
            # stops at the same round and asks nothing new
            if stop is not None and rnd < rounds and conversation is not None:
                conversation.end(world, rnd)
            break
    kept = best or result
    final = replace(kept, usage=usage.value(kept.usage, replayed=usage.replayed),
                    rounds=len(history), duration_s=round(time.time() - started, 3))
    if conversation is not None:
        final = replace(final, round=first_pass(history), round_history=tuple(history))
    return final


def readable(result: ItemResult) -> bool:
    """Can the pass's speedup be read? Where the summary names its band (`scoring.band`: its
    90% interval inside one band, the timing neither contended nor shared): the rule the
    scores are read by, so a round is asked for exactly what the summary calls slower."""
    return band(result.speedup, result.speedup_ci90, result.timing_trust) not in ("", INCONCLUSIVE)


def wants_speed(result: ItemResult) -> bool:
    """Is a pass worth a paid "make it faster" round? Only where its speedup is readable and
    below 1 (an untimed pass, a contended or inconclusive timing ends the rounds)."""
    return result.passed and readable(result) and (result.speedup or 0.0) < 1.0


def feedback(result: ItemResult) -> str:
    """What the next round is told about the last: the verdict and its evidence, or the
    per-size speedups of a pass. Never anything of the reference or the seed."""
    if result.passed:
        sizes = ", ".join(f"count {s.count}: {s.speedup:.2f}x" for s in result.sizes
                          if s.speedup is not None)
        return (f"verdict: pass, but slower than the expert solution: speedup "
                f"{result.speedup or 0:.3f} overall ({sizes}). Make it faster, "
                "keeping it correct.")
    parts = [f"verdict: {result.verdict}", result.message]
    if result.detail:
        parts.append(result.detail[-3000:])
    if result.output:
        parts.append("output (tail):\n" + result.output[-2000:])
    return "\n".join(p for p in parts if p)
