"""Models asked over their providers' APIs (the registry's aliases, `openai:ID`,
`anthropic:ID`).

One generation per task (and sample): every world size of the task judges the same reply.
Each generation is kept under the runs directory,

    <runs>/replies/<model>/<category>/<task>/s<sample>/r<round>/
        prompt.md   what was sent
        reply.md    what came back, as it came
        usage.json  tokens, cost and its price source, timing, the model's settings, the
                    request (endpoint, settings asked, usage, finish reason)

and reused from there by later items and later runs (no request is sent) unless
`--commbench-regenerate`. A lock file makes concurrent pytest-xdist workers that need the
same task wait for one request instead of sending several. A reused reply is `replayed`: it
keeps the tokens and cost it had when asked, so a rerun prices (and budgets) like the run
that asked; each kept reply is counted once per run (by the first item to get it), so the
other world sizes of its task add nothing to the run's totals."""

from __future__ import annotations

import fcntl
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..tasks import Task
from . import prices
from . import prompt as prompts
from .base import Asker, Candidate, Model, Reply
from .providers import ask
from .registry import ModelSpec

COUNTED = "counted"  # in a reply's folder: the run that counted a kept reply's cost


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


class ApiModel(Model):
    def __init__(self, spec: ModelSpec, where: Callable[[], dict[str, Any]]) -> None:
        """`where()` gives, when the first item asks, what the session knows then: runs_dir,
        run (its id), base_url, timeout_s, max_tokens, regenerate, fingerprint (the
        platform's)."""
        self.spec = spec
        self.name = spec.alias
        self._where = where

    def candidates(self, task: Task, references: Path) -> list[Candidate]:
        # the references root is the built-in models' alone: never read here
        samples = int(self._where().get("samples", 1))
        return [Candidate(f"s{k}" if samples > 1 else "", "solution",
                          lambda k=k: self.generate(task, sample=k, round_=1),
                          refine=lambda r, previous, feedback, k=k: self.generate(
                              task, sample=k, round_=r, previous=previous, feedback=feedback),
                          ended=lambda world, k=k: self.ended(task, k, world),
                          end=lambda world, r, k=k: self.end(task, k, world, r),
                          asker=Asker(
                              folder=lambda k=k: self.folder(
                                  task, Path(self._where()["runs_dir"]), k, 1).parent,
                              prompt=lambda: prompts.build(
                                  task, self._where().get("fingerprint", {})),
                              ask=self.ask,
                              regenerate=lambda: bool(self._where().get("regenerate"))))
                for k in range(samples)]

    def _ended_file(self, task: Task, sample: int, world: int) -> Path:
        return self.folder(task, Path(self._where()["runs_dir"]), sample, 1).parent / \
            f"ended-np{world}.json"

    def ended(self, task: Task, sample: int, world: int) -> int | None:
        """The round where an earlier run's conversation for this world size ended early
        (None where none did, or with --commbench-regenerate)."""
        if self._where().get("regenerate"):  # a new conversation: the old end is void
            self._ended_file(task, sample, world).unlink(missing_ok=True)
            return None
        try:
            return int(json.loads(self._ended_file(task, sample, world).read_text())["round"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def end(self, task: Task, sample: int, world: int, round_: int) -> None:
        path = self._ended_file(task, sample, world)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"round": round_}) + "\n")

    def folder(self, task: Task, runs_dir: Path, sample: int, round_: int) -> Path:
        """One answer per task, sample and round: every world size of the task is judged on
        it (a later round's answer is asked with the feedback of the first item of the task
        that needs it, and reused by the others and by later runs)."""
        return runs_dir / "replies" / _safe(self.name) / task.relpath / f"s{sample}" / f"r{round_}"

    def generate(self, task: Task, sample: int, round_: int, previous: str = "",
                 feedback: str = "") -> Reply:
        w = self._where()

        def text() -> str:
            out = prompts.build(task, w.get("fingerprint", {}))
            if round_ > 1:
                out += prompts.refinement(task, round_, previous, feedback)
            return out

        return self.ask(self.folder(task, Path(w["runs_dir"]), sample, round_), text)

    def ask(self, folder: Path, text: str | Callable[[], str]) -> Reply:
        """One request whose prompt and reply are kept in `folder` (prompt.md, reply.md,
        usage.json); a reply kept there is returned instead (no request) unless
        --commbench-regenerate. The prompt may be a function: it is only built where asked."""
        w = self._where()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one request per task, whatever the workers
            kept = None if w.get("regenerate") else _load(folder, w.get("run"))
            if kept is not None:
                kept.request.setdefault("id", _request_id(folder, w))
                return kept
            text = text() if callable(text) else text
            (folder / "prompt.md").write_text(text, encoding="utf-8")
            started = time.time()
            temperature = w.get("temperature")
            if temperature is None and int(w.get("samples", 1)) > 1:
                temperature = self.spec.temperature  # independent samples: the registry's
            got = ask(self.spec, text, w.get("base_url"), float(w.get("timeout_s", 600)),
                      temperature=temperature, max_tokens=w.get("max_tokens"))
            request = {**got.request, "id": _request_id(folder, w), "replayed": False}
            if got.error:  # an outage: nothing kept, the next run asks again
                return Reply(None, infra_error=got.error, request=request)
            cost, source = prices.cost(self.spec, got.tokens_in, got.tokens_out,
                                       w.get("base_url"))
            request.update(cost=cost, price=source)
            usage = {"tokens_in": got.tokens_in, "tokens_out": got.tokens_out, "cost": cost,
                     "price": source, "truncated": got.truncated,
                     "seconds": round(time.time() - started, 3), "run": w.get("run"),
                     "model": asdict(self.spec), "request": request}
            (folder / "reply.md").write_text(got.text or "", encoding="utf-8",
                                             errors="surrogateescape")
            (folder / "usage.json").write_text(json.dumps(usage, indent=1) + "\n")
            return Reply(got.text, got.tokens_in, got.tokens_out, cost or 0.0,
                         truncated=got.truncated, request=request)


def _request_id(folder: Path, w: dict[str, Any]) -> str:
    """A kept reply's name: its folder under the runs directory (the same for every item
    and run that uses it)."""
    try:
        return folder.relative_to(Path(w["runs_dir"])).as_posix()
    except (KeyError, ValueError):
        return folder.as_posix()


def _load(folder: Path, run: str | None = None) -> Reply | None:
    """A reply kept by an earlier item or run (called under the folder's lock): the same
    text, cut or not as it was, replayed with the tokens and cost recorded when it was asked.
    The first item of run `run` to get it counts them (it notes so in the folder); later
    items of the run, the task's other world sizes, count nothing, so the run's totals hold
    each answer once. Its request (in the record) keeps the cost either way: the budget of
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
    first = run is None or (usage.get("run") != run and _read(counted) != run)
    if first and run is not None:
        counted.write_text(run + "\n")
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


def _user_file(config) -> Path | None:
    from ..session import setting

    value = setting(config, "models_file")
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else config.invocation_params.dir / path


def make_api_model(config, name: str) -> ApiModel | None:
    """The registry's model called `name` (None: not a registry name). A broken registry
    file or a bad `openai:` name is a ValueError (a usage error naming it)."""
    from ..session import STATE, lookup, setting
    from .registry import resolve

    spec = resolve(name, _user_file(config))
    if spec is None:
        return None
    budget, given = lookup(config, "budget_usd")
    base_url = setting(config, "base_url")
    if budget is not None and not prices.price_known(spec, base_url):
        # a budget of unknown spend would never stop a round: refused before any item runs
        raise ValueError(
            f"{given} ({budget:g} US dollars) needs the price of model {name}, which is not "
            f"known: genai-prices {prices.version()} lists no "
            + (f"{spec.price_ref!r}" if spec.price_ref else
               f"{spec.model!r} at {prices.endpoint(spec, base_url)}")
            + "; set price_in and price_out (US dollars per million tokens), or a "
            "genai-prices price_ref, for it in a models file (--commbench-models-file)")

    def where() -> dict[str, Any]:
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
                "fingerprint": state.fingerprint}

    return ApiModel(spec, where)


def api_model_names(config) -> list[str]:
    from .registry import RegistryError, names

    try:
        return names(_user_file(config))
    except RegistryError:
        return ["openai:MODEL", "anthropic:MODEL"]
