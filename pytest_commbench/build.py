"""Hidden build recipes: the harness, never the model, turns a solution into something to run.

Python solutions are byte-compiled (a syntax error is `compile_error`) and the names the code
uses (from its syntax tree: loads, attributes, imports, string constants) are checked against the task's `forbid` patterns (`forbidden`). Results are cached by
the hash of the source and the recipe.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from .tasks import Task
from .verdicts import Rejected, Verdict

RECIPE_VERSION = "py-1"


@dataclass(frozen=True)
class Artifact:
    path: Path  # what the ranks load
    digest: str


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def used_names(tree: ast.AST) -> set[str]:
    """Every name the code uses (loaded names, attributes, imports, keyword arguments) and every
    string constant (so getattr(comm, "Allreduce") counts); names it defines do not count."""
    names: set[str] = set()
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):  # docstrings and bare strings do nothing
            names.add(node.value)
    return names


def forbidden_uses(names: set[str], patterns: tuple[str, ...]) -> list[str]:
    return sorted({n for n in names for p in patterns if fnmatchcase(n, p)})


def build_python(task: Task, source: str, cache_dir: Path) -> Artifact:
    key = digest(RECIPE_VERSION, task.relpath, source)
    try:
        tree = ast.parse(source, f"{task.relpath}/solution.py")
        compile(tree, f"{task.relpath}/solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        raise Rejected(Verdict.COMPILE_ERROR,
                       f"the solution does not compile: {exc.__class__.__name__}: {exc}",
                       f"line {line}" if line else "") from None
    bad = forbidden_uses(used_names(tree), task.forbid)
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the solution uses what this task forbids: {', '.join(bad)}",
                       f"forbidden patterns: {', '.join(task.forbid)}")
    folder = cache_dir / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "solution.py"
    if not path.exists():
        tmp = folder / f"solution.{id(source)}.tmp"
        tmp.write_text(source)
        tmp.replace(path)
    return Artifact(path, key)


RECIPES = {"python": build_python}
