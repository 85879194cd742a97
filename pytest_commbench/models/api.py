"""Models asked over their providers' APIs (the registry's aliases, `openai:ID`,
`anthropic:ID`).

One generation per task (and sample): every world size of the task judges the same reply.
Each generation is kept under the runs directory,

    <runs>/replies/<model>/<category>/<task>/s<sample>/r<round>/
        prompt.md   what was sent
        reply.md    what came back, as it came
        usage.json  tokens, cost, timing, the model's settings

and reused from there by later items and later runs (no request is sent) unless
`--commbench-regenerate`. A lock file makes concurrent pytest-xdist workers that need the
same task wait for one request instead of sending several."""

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
from . import prompt as prompts
from .base import Asker, Candidate, Model, Reply
from .providers import ask
from .registry import ModelSpec


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


class ApiModel(Model):
    def __init__(self, spec: ModelSpec, where: Callable[[], dict[str, Any]]) -> None:
        """`where()` gives, when the first item asks, what the session knows then: runs_dir,
        base_url, timeout_s, regenerate, fingerprint (the platform's)."""
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
            kept = None if w.get("regenerate") else _load(folder)
            if kept is not None:
                return kept
            text = text() if callable(text) else text
            (folder / "prompt.md").write_text(text, encoding="utf-8")
            started = time.time()
            temperature = w.get("temperature")
            if temperature is None and int(w.get("samples", 1)) > 1:
                temperature = self.spec.temperature  # independent samples: the registry's
            got = ask(self.spec, text, w.get("base_url"), float(w.get("timeout_s", 600)),
                      temperature=temperature)
            if got.error:  # an outage: nothing kept, the next run asks again
                return Reply(None, infra_error=got.error)
            cost = self.spec.cost(got.tokens_in, got.tokens_out)
            usage = {"tokens_in": got.tokens_in, "tokens_out": got.tokens_out, "cost": cost,
                     "seconds": round(time.time() - started, 3), "model": asdict(self.spec)}
            (folder / "reply.md").write_text(got.text or "", encoding="utf-8",
                                             errors="surrogateescape")
            (folder / "usage.json").write_text(json.dumps(usage, indent=1) + "\n")
            return Reply(got.text, got.tokens_in, got.tokens_out, cost or 0.0)


def _load(folder: Path) -> Reply | None:
    """A reply kept by an earlier item or run: the same text; its tokens and cost were
    counted where it was made, so they count nothing here."""
    reply, usage = folder / "reply.md", folder / "usage.json"
    if not (reply.is_file() and usage.is_file()):
        return None
    return Reply(reply.read_text(encoding="utf-8", errors="surrogateescape") or None)


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
    from ..session import STATE, setting
    from .registry import resolve

    spec = resolve(name, _user_file(config))
    if spec is None:
        return None

    def where() -> dict[str, Any]:
        state = config.stash.get(STATE, None)
        if state is None:  # at collection: what the options say
            return {"samples": setting(config, "samples")}
        return {"runs_dir": state.runs_dir, "base_url": setting(config, "base_url"),
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
