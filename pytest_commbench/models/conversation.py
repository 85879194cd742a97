"""Models that answer prompts, and their conversations, kept by the harness.

An `AskableModel` implements `answer(prompt) -> Reply` (one request to wherever it runs) and
nothing else: the harness builds its candidates (one per sample), and the strategies
(refinement rounds, agent mode) ask it through a `Conversation` per task and sample, which
keeps every prompt and reply under the runs directory,

    <runs>/replies/<model>/<category>/<task>/s<sample>/r<round>/  (agent mode: <agent>/<step>/)
        prompt.md   what was sent
        reply.md    what came back, as it came
        usage.json  tokens, cost and its price source, timing, the model's card, the request
                    (endpoint, settings asked, usage, finish reason)

and reuses them from there in later items and later runs (no request is sent) unless
`--commbench-regenerate`. One generation per task and sample: every world size of the task
judges the same reply. A lock file makes concurrent pytest-xdist workers that need the same
step wait for one request instead of sending several. A reused reply is `replayed`: it keeps
the tokens and cost it had when asked, so a rerun prices (and budgets) like the run that
asked; each kept reply is counted once per run (by the first item to get it), so the other
world sizes of its task add nothing to the run's totals. The item that counted it counts it
again whenever it runs again in the run (a retry after an infra_error, a resume after a
kill): its new record replaces the old one, so the cost stays in the run exactly once."""

from __future__ import annotations

import fcntl
import json
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ..tasks import Task
from . import prompt as prompts
from .base import Candidate, Model, Reply

COUNTED = "counted"  # in a reply's folder: the run (and item) that counted a kept reply's cost
# the node id of the item asking (set by the item while it runs): who counts a kept reply
ITEM: ContextVar[str | None] = ContextVar("commbench_item", default=None)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def sample_folder(replies: Path, model: str, task: str, sample: int) -> Path:
    """Where a model's conversation about a task and sample is kept, below a runs folder's
    `replies/`: `<model>/<category>/<task>/s<k>/` (its rounds `r1`, `r2`, ..., an agent run's
    steps under the agent's label)."""
    return Path(replies) / _safe(model) / task / f"s{sample}"


def last_round_reply(sample: Path) -> Path | None:
    """The reply of a conversation's last round (`r<n>/reply.md`), None where none is kept."""
    rounds = [d for d in sample.glob("r*") if d.name[1:].isdigit() and (d / "reply.md").is_file()]
    return max(rounds, key=lambda d: int(d.name[1:])) / "reply.md" if rounds else None


class AskableModel(Model):
    """A model that answers prompts (`answer`); made by a `pytest_commbench_make_model` hook
    with the pytest config, from which the harness reads where its conversations are kept."""

    def __init__(self, config) -> None:
        self.config = config

    def answer(self, prompt: str) -> Reply:
        """One request: the reply's text, its usage and cost, `truncated` if cut at the
        output limit, `infra_error` if the source could not answer (nothing is kept then, and
        the next run asks again), `request` what usage.json keeps of it."""
        raise NotImplementedError

    def card(self) -> dict[str, Any]:
        """What usage.json records of the model that answered."""
        return {"name": self.name}

    def place(self) -> dict[str, Any]:
        """What the session knows when the first item asks: runs_dir, run (its id),
        base_url, timeout_s, max_tokens, samples, temperature, regenerate, fingerprint (the
        platform's); at collection only samples."""
        from ..option_sources import setting
        from ..run_state import STATE

        config = self.config
        state = config.stash.get(STATE, None)
        if state is None:  # at collection: what the options say
            return {"samples": setting(config, "samples")}
        return {"runs_dir": state.runs_dir, "run": state.run_id,
                "base_url": setting(config, "base_url"),
                "max_tokens": setting(config, "max_tokens"),
                "samples": setting(config, "samples"),
                "temperature": setting(config, "temperature"),
                "timeout_s": setting(config, "request_timeout"),
                "regenerate": setting(config, "regenerate"),
                "hints": setting(config, "hints"),
                "fingerprint": state.fingerprint}

    def candidates(self, task: Task, references: Path) -> list[Candidate]:
        # the references root is the built-in models' alone: never read here
        samples = int(self.place().get("samples") or 1)
        made = []
        for k in range(samples):
            conversation = Conversation(self, task, k)
            made.append(Candidate(f"s{k}" if samples > 1 else "", "solution",
                                  conversation.first, conversation=conversation))
        return made


class Conversation:
    """One model's conversation about one task and sample (`models.base.Asking`)."""

    def __init__(self, model: AskableModel, task: Task, sample: int) -> None:
        self.model, self.task, self.sample = model, task, sample

    @property
    def folder(self) -> Path:
        runs_dir = Path(self.model.place()["runs_dir"])
        # a reply to a prompt with hints is another model configuration's: kept apart
        name = self.model.name + ("+hints" if self.hints else "")
        return sample_folder(runs_dir / "replies", name, self.task.relpath, self.sample)

    @property
    def hints(self) -> bool:
        return bool(self.model.place().get("hints"))

    def prompt(self) -> str:
        return prompts.build(self.task, self.model.place().get("fingerprint", {}), self.hints)

    def regenerate(self) -> bool:
        return bool(self.model.place().get("regenerate"))

    def first(self) -> Reply:
        return self.ask(self.folder / "r1", self.prompt)

    def again(self, round_: int, previous: str, feedback: str) -> Reply:
        """One answer per task, sample and round: every world size of the task is judged on
        it (a later round's answer is asked with the feedback of the first item of the task
        that needs it, and reused by the others and by later runs)."""
        return self.ask(self.folder / f"r{round_}", lambda: self.prompt() + prompts.refinement(
            self.task, round_, previous, feedback))

    def _ended_file(self, world: int) -> Path:
        return self.folder / f"ended-np{world}.json"

    def ended(self, world: int) -> int | None:
        if self.regenerate():  # a new conversation: the old end is void
            self._ended_file(world).unlink(missing_ok=True)
            return None
        try:
            return int(json.loads(self._ended_file(world).read_text())["round"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def end(self, world: int, round_: int) -> None:
        path = self._ended_file(world)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"round": round_}) + "\n")

    def ask(self, step: Path, prompt: str | Callable[[], str]) -> Reply:
        """One request whose prompt and reply are kept in `step` (prompt.md, reply.md,
        usage.json); a reply kept there is returned instead (no request) unless
        --commbench-regenerate. The prompt may be a function: it is only built where asked."""
        place = self.model.place()
        runs_dir = Path(place["runs_dir"])
        step.mkdir(parents=True, exist_ok=True)
        with open(step.parent / f".{step.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one request per step, whatever the workers
            kept = None if place.get("regenerate") else _load(step, place.get("run"),
                                                              ITEM.get())
            if kept is not None:
                kept.request.setdefault("id", _request_id(step, runs_dir))
                return kept
            text = prompt() if callable(prompt) else prompt
            (step / "prompt.md").write_text(text, encoding="utf-8")
            started = time.time()
            # (a source that raises is an outage where the strategy asked: evaluate's and the
            # agent's own handling, which name the step)
            reply = self.model.answer(text)
            request = {**(reply.request or {}), "id": _request_id(step, runs_dir),
                       "replayed": False}
            reply.request = request
            if reply.infra_error:  # an outage: nothing kept, the next run asks again
                return reply
            usage = {"tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out,
                     "cost": request.get("cost", reply.cost), "price": request.get("price"),
                     "truncated": reply.truncated,
                     "seconds": round(time.time() - started, 3), "run": place.get("run"),
                     "item": ITEM.get(),
                     "model": self.model.card(), "request": request}
            (step / "reply.md").write_text(reply.text or "", encoding="utf-8",
                                           errors="surrogateescape")
            (step / "usage.json").write_text(json.dumps(usage, indent=1) + "\n")
            return reply


def _request_id(folder: Path, runs_dir: Path) -> str:
    """A kept reply's name: its folder under the runs directory (the same for every item
    and run that uses it)."""
    try:
        return folder.relative_to(runs_dir).as_posix()
    except ValueError:
        return folder.as_posix()


def _load(folder: Path, run: str | None = None, item: str | None = None) -> Reply | None:
    """A reply kept by an earlier item or run (called under the folder's lock): the same
    text, cut or not as it was, replayed with the tokens and cost recorded when it was asked.
    The first item of run `run` to get it counts them (it notes so in the folder, or asked
    it in this run); later items of the run, the task's other world sizes, count nothing, so
    the run's totals hold each answer once. That first item (`item`) counts them again when
    it runs again: its record replaces the one that counted them. Its request (in the record) keeps the cost either way: the budget of
    every item that used the answer counts it, so each stops at the round the asker did."""
    reply, kept = folder / "reply.md", folder / "usage.json"
    if not (reply.is_file() and kept.is_file()):
        return None
    try:
        usage = json.loads(kept.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        usage = {}
    usage = usage if isinstance(usage, dict) else {}
    request = usage.get("request") if isinstance(usage.get("request"), dict) else {}
    request = {**request, "replayed": True}
    request.setdefault("cost", usage.get("cost"))
    request.setdefault("price", usage.get("price"))
    counted = folder / COUNTED
    if run is None:
        first = True
    elif usage.get("run") == run:  # asked in this run: its asker counted it
        first = item is not None and usage.get("item") == item
    else:
        mark_run, _, mark_item = (_read(counted) or "").partition(" ")
        first = mark_run != run or (item is not None and mark_item == item)
        if mark_run != run:
            counted.write_text(f"{run} {item or ''}".strip() + "\n")
    tokens_in, tokens_out = _count(usage.get("tokens_in")), _count(usage.get("tokens_out"))
    cost = usage.get("cost") if isinstance(usage.get("cost"), (int, float)) else 0.0
    truncated = bool(usage.get("truncated")) or request.get("finish_reason") in (
        "length", "max_tokens")
    text = reply.read_text(encoding="utf-8", errors="surrogateescape") or None
    if not first:
        tokens_in = tokens_out = 0
        cost = 0.0
    return Reply(text, tokens_in, tokens_out, float(cost or 0.0), truncated=truncated,
                 replayed=True, request=request)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
