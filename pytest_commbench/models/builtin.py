"""Built-in models: reference, template, mutants and dir:PATH."""

from __future__ import annotations

from pathlib import Path

from ..mutants import MutantError, mutants
from ..regions import MAX_REPLY_CHARS
from ..tasks import Task
from .base import Candidate, Model, Reply

# enough bytes to hold MAX_REPLY_CHARS characters of any UTF-8 text, and one more: a longer
# file is read no further (it is no solution however it goes on)
READ_LIMIT = 4 * (MAX_REPLY_CHARS + 1)


def _read(path: Path) -> Reply:
    """A reply from a file. Bytes that are not UTF-8 are no usable solution: they come back as
    surrogate escapes, which `regions.merge_reply` rejects as no_solution saying so (the
    reply is the model's, so is its encoding)."""
    try:
        with open(path, "rb") as f:
            data = f.read(READ_LIMIT)
    except (FileNotFoundError, IsADirectoryError):
        return Reply(None)
    try:
        return Reply(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Reply(data.decode("utf-8", errors="surrogateescape"))


def _mutant(load) -> Reply:
    try:
        return Reply(load())
    except FileNotFoundError:
        return Reply(None)
    except (MutantError, OSError) as exc:  # the benchmark's own mutant is broken
        return Reply(None, infra_error=str(exc))


class ReferenceModel(Model):
    """The hidden expert solution: must pass everything with speedup ~1."""

    name = "reference"

    def candidates(self, task, references):
        path = references / task.relpath / f"solution{task.suffix}"
        return [Candidate("", "solution", lambda: _read(path))]


class TemplateModel(Model):
    """The unchanged template: must fail everything."""

    name = "template"

    def candidates(self, task, references):
        return [Candidate("", "solution", lambda: _read(task.template))]


class MutantsModel(Model):
    """Each known-wrong solution of each task; the item passes when the mutant is rejected."""

    name = "mutants"

    def candidates(self, task: Task, references: Path) -> list[Candidate]:
        return [Candidate(f"mutant-{name}", "mutant", lambda load=load: _mutant(load))
                for name, load in mutants(references / task.relpath, task.suffix)]


class DirModel(Model):
    """Solutions generated elsewhere: PATH/<category>/<task>/solution.<ext> (a full file) or
    PATH/<category>/<task>/reply.md (a raw model reply, merged into the template)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # named by its folder, as a model is: the absolute path said where the answers lay on
        # one machine in every report (issue 41); run.json's args keep the path given
        self.name = f"dir:{root.resolve().name or root}"

    def candidates(self, task, references):
        folder = self.root / task.relpath

        def produce() -> Reply:
            for name in (f"solution{task.suffix}", "reply.md", "reply.txt"):
                if (folder / name).is_file():
                    return _read(folder / name)
            return Reply(None)

        return [Candidate("", "solution", produce)]


def make_builtin(name: str, rootdir: Path) -> Model | None:
    """The built-in model called `name`, None if there is none; ValueError for a `dir:` that
    does not exist."""
    if name == "reference":
        return ReferenceModel()
    if name == "template":
        return TemplateModel()
    if name == "mutants":
        return MutantsModel()
    if name.startswith("dir:"):
        if not name[4:].strip():
            raise ValueError("dir: needs a directory, as dir:PATH")
        root = Path(name[4:]).expanduser()
        if not root.is_absolute():
            root = rootdir / root
        if not root.is_dir():
            raise ValueError(f"no directory {str(root)!r} for {name!r}"
                             + (" (it is a file)" if root.exists() else ""))
        return DirModel(root)
    return None


BUILTIN_NAMES = ("reference", "template", "mutants", "dir:PATH")
