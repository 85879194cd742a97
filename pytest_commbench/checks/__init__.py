"""Correctness oracles, one module per operation family; a task names its op in `check.op`.

Every module of this package that defines `OPS = {"name": OpInstance}` is registered: adding an
oracle needs no edit here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from .base import Case, Op, Trial, compare, poison_value


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, Op]:
    ops: dict[str, Op] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, op in getattr(module, "OPS", {}).items():
            if name in ops:
                raise RuntimeError(f"check op {name!r} is defined twice")
            ops[name] = op
    return ops


def known_ops() -> set[str]:
    return set(_registry())


def get(op: str) -> Op:
    return _registry()[op]


__all__ = ["Case", "Op", "Trial", "compare", "get", "known_ops", "poison_value"]
