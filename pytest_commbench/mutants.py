"""Known-wrong solutions of a task, kept next to its reference.

A mutant is either a whole file (`mutants/NAME.py`, `mutants/NAME.cu`) or, usually, the
reference with a few edits (`mutants/NAME.toml`), so a mutant stays one bug away from the
reference whatever else changes there:

    about = "what is wrong, in one line"
    [[replace]]
    old = '''text that occurs exactly once in the reference'''
    new = '''what it becomes'''

The edits apply in order, each to the text the previous ones left; an `old` that does not
occur exactly once is an error naming the mutant and the edit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .tasks import tomllib


class MutantError(Exception):
    """A mutant that cannot be built from its reference (the benchmark's fault)."""


def apply_edits(reference: str, edits: list[dict], name: str) -> str:
    text = reference
    for k, edit in enumerate(edits, 1):
        old, new = edit.get("old"), edit.get("new")
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise MutantError(f"mutant {name}: edit {k} needs a non-empty 'old' and a 'new' string")
        found = text.count(old)
        if found != 1:
            raise MutantError(f"mutant {name}: edit {k}'s old text occurs {found} times in the "
                              f"reference (must be once): {old[:80]!r}")
        text = text.replace(old, new)
    return text


def load(path: Path, reference: Path) -> str:
    """The mutant's full source (raises MutantError, OSError)."""
    if path.suffix != ".toml":
        return path.read_text(encoding="utf-8")
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise MutantError(f"mutant {path.stem}: {path}: {exc}") from None
    edits = spec.get("replace")
    if not isinstance(edits, list) or not edits:
        raise MutantError(f"mutant {path.stem}: {path} has no [[replace]] edits")
    return apply_edits(reference.read_text(encoding="utf-8"), edits, path.stem)


def mutants(ref_dir: Path, suffix: str) -> list[tuple[str, Callable[[], str]]]:
    """(name, loader) of every mutant of the task whose reference lives in `ref_dir`."""
    folder = ref_dir / "mutants"
    reference = ref_dir / f"solution{suffix}"
    paths = sorted([*folder.glob(f"*{suffix}"), *folder.glob("*.toml")], key=lambda p: p.stem)
    return [(p.stem, lambda p=p: load(p, reference)) for p in paths]
