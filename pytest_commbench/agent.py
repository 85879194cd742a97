"""Agent mode (`--commbench-agent=geak`): a loop around a code model after GEAK, an agentic
kernel-generation framework. Per task and sample:

- the **generator** writes a solution (the task's prompt, plus the knowledge packs of the
  libraries the task uses and, with `--commbench-retrieval=on`, the most similar other task);
- the harness **evaluates** it (`engine.evaluate`: the same verdicts as every item, never the
  reference's code);
- on a failure the **reflector** (a model call) gets the code and the evidence and returns an
  analysis, which goes into the next generation; after `--commbench-max-debug` consecutive fix
  attempts that end in the same error (the debugging trap) the next generation starts afresh;
- once a solution passes, the **optimizer** gets its per-size speedups and proposes a faster
  version, kept only where it passes and is measurably faster (`faster`); a proposal that
  fails or is not shown faster is discarded and the optimizer hears why.

`--commbench-rounds` bounds the evaluated iterations (generations and proposals; reflections
are model calls that cost, not iterations). The item's record is the best passing iteration's
(else the last), with every step's tokens and cost summed, `round` the iteration that first
passed and `round_history` one entry per iteration.

Every step is kept under the sample's folder, `<runs>/replies/<model>/<task>/s<k>/<label>/`:
`NN-<role>/` with prompt.md, reply.md, usage.json and, per world size, verdict-np<W>.json;
`done.json` once a run ended (its steps, iterations and why). A later item of the task (another
world size) and a rerun replay the kept steps in order, roles and all, and judge them again;
once the kept steps of an ended run are used up they stop there and ask nothing. An outage
ends the run as `infra_error` without `done.json`: a rerun replays the steps kept so far and
goes on from there.
"""

from __future__ import annotations

import fcntl
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .engine import ItemResult, Usage, evaluate, feedback, first_pass
from .engine.refinement import readable
from .models.base import Candidate, Reply
from .record import AgentSummary, Attempt, Round
from .scoring import BANDS, band
from .tasks import Task, load_suite
from .verdicts import Verdict

KNOWLEDGE_DIR = "knowledge"  # <suites>/knowledge/<library or feature>.md
ROLES = ("generate", "reflect", "optimize")
# named bands from the slowest up (inconclusive and untimed have no rank)
BAND_RANK = {name: i for i, (_, name) in enumerate(reversed(BANDS))}
EVIDENCE_CHARS = 6000


# -- the knowledge packs and the retrieved task --------------------------------------------------

def knowledge_names(task: Task) -> list[str]:
    """What the task uses, in order: its library, then its required features and fixtures."""
    return list(dict.fromkeys([task.library, *task.requires, *task.fixtures]))


def knowledge(task: Task, suites: Path) -> list[tuple[str, str]]:
    """(name, text) of every knowledge pack of the suite that the task uses."""
    out = []
    for name in knowledge_names(task):
        path = suites / KNOWLEDGE_DIR / f"{name}.md"
        if path.is_file():
            out.append((name, path.read_text(encoding="utf-8").strip()))
    return out


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


def similarity(a: Task, b: Task) -> float:
    """How alike two tasks are, for retrieval: the library counts most, then the category,
    the features they share and the words of their titles."""
    score = 4.0 * (a.library == b.library) + 2.0 * (a.category == b.category)
    score += len(set(a.requires) & set(b.requires)) + 0.5 * (a.difficulty == b.difficulty)
    wa, wb = _words(a.title), _words(b.title)
    return score + (2.0 * len(wa & wb) / len(wa | wb) if wa | wb else 0.0)


def most_similar(task: Task, suites: Path) -> Task | None:
    """The most similar *other* task of the suite in the same language (its prompt and template
    are what a model is shown anyway; its reference is never read)."""
    best: tuple[float, str, Task] | None = None
    for other in load_suite(suites)[0]:
        if other.relpath == task.relpath or other.language != task.language:
            continue
        key = (similarity(task, other), other.relpath)
        if best is None or key[0] > best[0]:
            best = (key[0], key[1], other)
    return best[2] if best else None


# -- prompts ---------------------------------------------------------------------------------------

def first_prompt(base: str, task: Task, suites: Path, use_knowledge: bool,
                 retrieval: bool) -> tuple[str, dict[str, Any]]:
    """The generator's prompt: the task's prompt as direct prompting sends it, plus the packs
    and the retrieved task. Returns it and what was added."""
    parts, added = [base.rstrip() + "\n"], {"knowledge": [], "retrieved": None}
    if use_knowledge:
        for name, text in knowledge(task, suites):
            parts.append(f"\n## Library notes: {name}\n\n{text}\n")
            added["knowledge"].append(name)
    if retrieval:
        other = most_similar(task, suites)
        if other is not None:
            fence = "python" if other.language == "python" else "cuda"
            parts.append(
                f"\n## A related task, for orientation only (not the one to solve): "
                f"{other.title}\n\n{other.prompt.read_text(encoding='utf-8').strip()}\n\n"
                f"Its template:\n\n```{fence}\n"
                f"{other.template.read_text(encoding='utf-8').rstrip()}\n```\n")
            added["retrieved"] = other.relpath
    return "".join(parts), added


def _fenced(task: Task, text: str) -> str:
    fence = "python" if task.language == "python" else "cuda"
    return f"```{fence}\n{(text or '(empty)').strip()}\n```"


def reflect_prompt(first: str, task: Task, code: str, evidence: str) -> str:
    return f"""{first.rstrip()}

## Reflection: an attempt at this task failed

You are reviewing an attempt at the task above. The attempt:

{_fenced(task, code)}

What the harness found:

```
{evidence.strip()[-EVIDENCE_CHARS:]}
```

Explain what went wrong and how to fix it: the cause, the lines at fault and the change to
make, in a few short paragraphs. Do not write the whole solution.
"""


def generate_prompt(first: str, task: Task, code: str, evidence: str, analysis: str) -> str:
    return f"""{first.rstrip()}

## Your previous attempt, what the harness found, and an analysis of it

{_fenced(task, code)}

```
{evidence.strip()[-EVIDENCE_CHARS:]}
```

Analysis:

{(analysis or '(none)').strip()}

Answer again, in the same form, with the fix.
"""


def _attempt(value: Attempt | Mapping[str, Any]) -> Attempt:
    return value if isinstance(value, Attempt) else Attempt.from_json(value)


def _band(a: Attempt) -> str:
    return band(a.speedup, a.speedup_ci90, a.timing_trust)


def speedup_lines(result: Attempt | Mapping[str, Any]) -> str:
    a = _attempt(result)
    iv = a.speedup_ci90
    lines = [f"overall speedup {a.speedup or 0:.3f}"
             + (f" (90% interval [{iv[0]:.3f}, {iv[1]:.3f}])" if iv else "")
             + f", band {_band(a) or '-'}, timing trust {a.timing_trust or '-'}"]
    for s in a.sizes:
        if s.speedup is not None:
            lines.append(f"count {s.count} ({s.dtype}, {s.bytes or 0:,} bytes): "
                         f"speedup {s.speedup:.3f}, {s.t_sol_us or 0:.1f} us per call "
                         f"against {s.t_ref_us or 0:.1f} us")
    return "\n".join(lines)


def optimize_prompt(first: str, task: Task, code: str, best: Attempt,
                    last: str) -> str:
    tail = f"\n\nYour last proposal was discarded: {last}" if last else ""
    return f"""{first.rstrip()}

## Optimize: a correct solution, and how fast it is

This solution passes every check:

{_fenced(task, code)}

Its speed against the expert solution (speedup = expert time / this time, per size; above 1
is faster than the expert):

```
{speedup_lines(best)}
```{tail}

Propose a faster version that stays correct: look at the sizes with the lowest speedups
first. Answer in the same form (the whole file or the regions). It is kept only if it passes
and its measured speedup is higher.
"""


# -- the rule for "faster" -------------------------------------------------------------------------

def faster(new: Attempt | Mapping[str, Any], best: Attempt | Mapping[str, Any]
           ) -> tuple[bool, str]:
    """Is a passing proposal measurably faster than the best so far? Only where the timing
    says so: its speedup's 90% interval lies wholly above the best's speedup, or its band (a
    band is only named where the interval lies inside it and the timing was not contended)
    is a better one than the best's named band. An untimed pass (check only) is never
    faster. Returns the decision and why."""
    new, best = _attempt(new), _attempt(best)
    if not new.passed:
        return False, f"it failed ({new.verdict}: {str(new.message)[:300]})"
    s_new, s_best = new.speedup, best.speedup
    if s_new is None or s_best is None:
        return False, "it passed, but without timing nothing shows it faster"
    iv = new.speedup_ci90
    if iv and iv[0] > s_best:
        return True, (f"speedup {s_new:.3f}, its 90% interval [{iv[0]:.3f}, {iv[1]:.3f}] above "
                      f"the best's {s_best:.3f}")
    b_new, b_best = _band(new), _band(best)
    if b_new in BAND_RANK and b_best in BAND_RANK and BAND_RANK[b_new] > BAND_RANK[b_best]:
        return True, f"band {b_new} above the best's {b_best}"
    where = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "no interval"
    return False, (f"it passed with speedup {s_new:.3f} ({where}), not shown faster than the "
                   f"best's {s_best:.3f} (band {b_new or '-'} against {b_best or '-'})")


def signature(result: Attempt | Mapping[str, Any]) -> str:
    """An error's identity for the debugging trap: the verdict and its message without the
    numbers (addresses, counts and times change from run to run)."""
    a = _attempt(result)
    message = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", str(a.message).lower())
    return f"{a.verdict}: {message[:200]}"


# -- the loop --------------------------------------------------------------------------------------

@dataclass
class Step:
    number: int
    role: str
    folder: Path


@dataclass
class Run:
    """One agent run's state."""

    first: str  # the generator's first prompt
    steps: list[Step] = field(default_factory=list)
    history: list[Round] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    usage: Usage = field(default_factory=Usage)  # every step's tokens, cost and request
    best: Attempt | None = None  # the best passing iteration's result
    best_text: str = ""
    failed: Attempt | None = None  # the failing attempt being debugged
    failed_text: str = ""
    analysis: str | None = None  # the reflector's analysis of it
    debug: int = 0  # consecutive fix attempts that ended in the error they were to fix
    fresh: bool = False  # the debugging trap sprang: the next generation starts afresh
    restarts: int = 0
    kept: int = 0  # optimizations kept
    last_discarded: str = ""
    last: Attempt | None = None  # the last evaluated result


class GeakAgent:
    """The GEAK loop (see the module's doc). `max_debug`, `use_knowledge` and `retrieval` are
    its settings; `suites` the suites root (knowledge packs, retrieval)."""

    name = "geak"

    def __init__(self, suites: Path, max_debug: int = 3, use_knowledge: bool = True,
                 retrieval: bool = False) -> None:
        self.suites = suites
        self.max_debug = max_debug
        self.use_knowledge = use_knowledge
        self.retrieval = retrieval

    @property
    def label(self) -> str:
        """The configuration, as records and step folders name it."""
        return (self.name + ("" if self.use_knowledge else "-noknowledge")
                + ("-retrieval" if self.retrieval else ""))

    # -- the kept steps ------------------------------------------------------------------------
    def _kept(self, root: Path) -> dict[int, Step]:
        return kept_steps(root)

    def run(self, task: Task, world: int, candidate: Candidate, platform,
            settings) -> ItemResult:
        root = candidate.conversation.folder / self.label
        root.mkdir(parents=True, exist_ok=True)
        # one agent run of a task and sample at a time: the first item asks, the others (its
        # other world sizes, on other workers too) wait and replay its steps
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._run(task, world, candidate, platform, settings, root)

    def _run(self, task, world, candidate, platform, settings, root: Path) -> ItemResult:
        import time

        started = time.time()
        conversation = candidate.conversation
        done_file = root / "done.json"
        if conversation.regenerate():
            done_file.unlink(missing_ok=True)
        done = _read_json(done_file)
        kept = {} if conversation.regenerate() else self._kept(root)
        first, added = first_prompt(conversation.prompt(), task, self.suites,
                                    self.use_knowledge, self.retrieval)
        run = Run(first)
        rounds = max(1, settings.rounds)
        iteration, number, stop = 0, 0, None
        while stop is None:
            if iteration >= rounds:
                stop = "rounds"
                break
            number += 1
            step = kept.get(number)
            if step is None:
                # past the kept steps of a run that ended: a replay asks nothing new (a run
                # that used all its rounds goes on where --commbench-rounds was raised)
                if done is not None and not (done.get("stop") == "rounds"
                                             and iteration >= int(done.get("iterations", 0))):
                    stop = f"replayed ({done.get('stop')})"
                    break
                if settings.budget_usd is not None and run.usage.spent >= settings.budget_usd:
                    stop = "budget"
                    break
                role = self._decide(run, settings)
                if role is None:
                    stop = ("nothing to optimize without timing (check only)"
                            if settings.check_only or run.best.speedup is None else
                            "the best's timing cannot be read "
                            f"({run.best.timing_trust or 'no interval'}): no proposal could "
                            "be shown faster")
                    break
                step = Step(number, role, root / f"{number:02d}-{role}")
            # the prompt is built only where the step is asked (a kept step's is on disk)
            reply = _ask(conversation, step.folder,
                         lambda s=step: self._prompt(run, s.role, task, feedback))
            run.calls[step.role] += 1
            run.usage.add(reply.tokens_in, reply.tokens_out, reply.cost,
                          [reply.request] if reply.request else [])
            run.steps.append(step)
            if reply.infra_error:
                return self._outage(run, reply.infra_error, step, started, added)
            if step.role == "reflect":
                run.analysis = reply.text or ""
                continue
            iteration += 1
            # the step's reply as the model gave it (a cut reply is judged `truncated`)
            # (its tokens and cost are counted once, in the run's usage above)
            answer = Reply(reply.text, truncated=reply.truncated, replayed=reply.replayed,
                           request=reply.request)
            result = evaluate(task, world, answer, platform, settings, kind=candidate.kind)
            entry = self._judge(run, step, result, result.reply_text, iteration)
            ci90 = result.speedup_ci90
            _write_json(step.folder / f"verdict-np{world}.json",
                        {**entry.to_json(), "message": str(result.message)[:2000],
                         "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out,
                         "cost": reply.cost, "speedup_ci90": None if ci90 is None else list(ci90),
                         "sizes": [{"count": s.count, "dtype": s.dtype, "speedup": s.speedup}
                                   for s in result.sizes]})
            if result.verdict == Verdict.INFRA_ERROR:
                stop = "infra_error"  # the harness or the reference failed: asking won't help
        if done is None and stop != "infra_error":  # a stop reason, not a verdict
            _write_json(done_file, {"stop": stop, "steps": number - (stop != "rounds"),
                                    "iterations": iteration})
        return self._final(run, stop, started, added)

    def _decide(self, run: Run, settings) -> str | None:
        if run.best is None:
            if run.failed is None or run.fresh or run.analysis is not None:
                return "generate"
            return "reflect"
        if settings.check_only or run.best.speedup is None:
            return None
        if not readable(run.best):  # no proposal could be shown faster than this number
            return None
        return "optimize"

    def _prompt(self, run: Run, role: str, task: Task, feedback) -> str:
        if role == "reflect":
            return reflect_prompt(run.first, task, run.failed_text,
                                  feedback(run.failed) if run.failed else "")
        if role == "optimize" and run.best is not None:
            return optimize_prompt(run.first, task, run.best_text, run.best, run.last_discarded)
        if run.failed is None or run.fresh or role == "optimize":
            return run.first
        return generate_prompt(run.first, task, run.failed_text, feedback(run.failed),
                               run.analysis or "")

    def _judge(self, run: Run, step: Step, result: Attempt, text: str,
               iteration: int) -> Round:
        """Take an evaluated iteration into the run's state; its history entry."""
        entry = Round(round=iteration, step=step.number, role=step.role, verdict=result.verdict,
                      speedup=result.speedup, message=str(result.message)[:300])
        run.last = result
        if run.best is None:
            fixing = run.failed is not None and not run.fresh
            run.fresh = False
            if result.passed:
                run.best, run.best_text, run.failed, run.analysis = result, text, None, None
                entry = replace(entry, kept=True)
            else:
                same = fixing and signature(result) == signature(run.failed)
                run.debug = run.debug + 1 if same else 0
                run.failed, run.failed_text, run.analysis = result, text, None
                if run.debug >= self.max_debug:  # the debugging trap: start afresh
                    run.fresh, run.debug = True, 0
                    run.restarts += 1
                    entry = replace(entry, restart=True)
        else:  # an optimizer's proposal (or a kept step of another role, judged alike)
            better, why = faster(result, run.best)
            entry = replace(entry, kept=better, why=why)
            if better:
                run.best, run.best_text, run.last_discarded = result, text, ""
                run.kept += 1
            else:
                run.last_discarded = why
        run.history.append(entry)
        return entry

    def _result(self, run: Run, base: ItemResult, stop: str | None, started: float,
                added: dict[str, Any]) -> ItemResult:
        """The item's result: `base` (the kept answer's evaluation, else the last's, else an
        outage or nothing) with every step's usage, the iterations' history and the agent's
        summary."""
        import time

        first = run.history[0] if run.history else None
        agent = AgentSummary(
            label=self.label, calls=dict(run.calls), restarts=run.restarts, kept=run.kept,
            stop=stop,
            first=None if first is None else Round(verdict=first.verdict, speedup=first.speedup),
            knowledge=tuple(added["knowledge"]), retrieved=added["retrieved"],
            steps=tuple(f"{s.number:02d}-{s.role}" for s in run.steps),
            iteration=(next(h.round for h in reversed(run.history) if h.kept)
                       if run.best is not None else None))
        return replace(base, usage=run.usage.value(base.usage), rounds=len(run.history),
                       round_history=tuple(run.history), round=first_pass(run.history),
                       agent=agent, duration_s=round(time.time() - started, 3))

    def _final(self, run: Run, stop: str | None, started: float,
               added: dict[str, Any]) -> ItemResult:
        kept = run.best or run.last
        base = kept if kept is not None else ItemResult(Verdict.NO_SOLUTION.value,
                                                        "the agent evaluated nothing")
        return self._result(run, base, stop, started, added)

    def _outage(self, run: Run, error: str, step: Step, started: float,
                added: dict[str, Any]) -> ItemResult:
        reached = ("" if run.best is None else
                   f"; best so far: a pass at iteration "
                   f"{next(h.round for h in reversed(run.history) if h.kept)}")
        base = ItemResult(Verdict.INFRA_ERROR.value,
                          f"the model source failed at agent step {step.number} "
                          f"({step.role}): {error}{reached}; the steps before it are kept "
                          "and a rerun goes on from there")
        return self._result(run, base, f"outage at step {step.number}", started, added)


def _ask(conversation, folder: Path, prompt) -> Reply:
    try:
        return conversation.ask(folder, prompt)
    except Exception as exc:  # noqa: BLE001 - a model source that fails is an outage
        return Reply(None, infra_error=f"{exc.__class__.__name__}: {exc}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def kept_steps(root: Path) -> dict[int, Step]:
    """The steps kept in an agent run's folder (`NN-<role>/` with its reply), by number."""
    out = {}
    for d in root.glob("[0-9][0-9]-*") if root.is_dir() else ():
        number, _, role = d.name.partition("-")
        if role in ROLES and (d / "reply.md").is_file():
            out[int(number)] = Step(int(number), role, d)
    return out


def standing_answer(root: Path) -> Path | None:
    """The reply an agent run stands by: its last step judged `kept` (a step's
    verdict-np<W>.json says so), else its last step; None where it kept no step."""
    steps = [step for _, step in sorted(kept_steps(root).items())]
    for step in reversed(steps):
        for verdict in step.folder.glob("verdict-np*.json"):
            try:
                if json.loads(verdict.read_text()).get("kept"):
                    return step.folder / "reply.md"
            except (OSError, ValueError):
                continue
    return steps[-1].folder / "reply.md" if steps else None
