"""Correctness oracles, one module per operation family; a task names its op in `check.op`.

Every module of this package that defines `OPS = {"name": OpInstance}` is registered: adding an
oracle needs no edit here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

from .base import Case, Op, Trial, compare, poison_value


def _declared(module: str) -> list[str] | None:
    """The op names a module's top-level `OPS = {"name": ..., ...}` declares, read from its
    source; None where it declares them otherwise (the module is imported to know)."""
    source = (Path(__file__).with_name(f"{module}.py")).read_text()
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "OPS"):
            if isinstance(node.value, ast.Dict) and all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys):
                return [k.value for k in node.value.keys]
            return None
    return []


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """Op name -> the module that defines it. Modules are imported only when one of their ops
    is used: collecting a suite does not pay for every oracle's imports (ml_dtypes alone
    costs a process more than half a second)."""
    where: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base":
            continue
        names = _declared(info.name)
        if names is None:
            names = list(getattr(_module(info.name), "OPS", {}))
        for name in names:
            if name in where:
                raise RuntimeError(f"check op {name!r} is defined twice")
            where[name] = info.name
    return where


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def known_ops() -> set[str]:
    return set(_index())


def get(op: str) -> Op:
    module = _module(_index()[op])
    try:
        return module.OPS[op]
    except (AttributeError, KeyError):
        raise RuntimeError(f"check op {op!r}: {module.__name__} declares it, OPS lacks it") from None


__all__ = ["Case", "Op", "Trial", "compare", "get", "known_ops", "poison_value"]
