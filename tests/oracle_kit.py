"""What the oracle tests of task groups share: a suite task by path, a case of its op, the
op's expected outputs written as a right solution would write them, and its verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pytest_commbench import checks
from pytest_commbench.tasks import load_task

REPO = Path(__file__).resolve().parent.parent


def task_of(rel: str):
    return load_task(REPO / "suites" / rel / "task.toml", REPO / "suites")


def case_of(rel: str, count: int, world: int, seed: int = 1, trials: int = 2):
    """(task, op, case) of a suite task at one size and world size."""
    task = task_of(rel)
    op = checks.get(task.check.op)
    rng = np.random.default_rng(seed)
    case = op.make_case(rng, "c0", count, task.check.dtypes[0], world, task.check.params,
                        trials, 0)
    return task, op, case


def want(op, trial, case):
    return op.expected(trial, case.count, case.dtype, case.world, case.params)


def as_got(expected, trial):
    """The expected outputs in the outputs' own dtypes (what a right solution writes)."""
    return [{name: np.asarray(expected[r][name]).astype(dtype).reshape(shape)
             for name, (shape, dtype) in trial.outputs[r].items()}
            for r in range(len(trial.outputs))]


def verify(task, op, trial, got, case):
    return op.verify(trial, got, [], case, task.check.rtol, task.check.atol)
