"""Run-wide state: resolved settings, the model, the platform, the secret seed, the log."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .platforms import detect
from .results import ResultsLog

STATE = pytest.StashKey["CommbenchState"]()

DEFAULTS = {
    "model": "reference",
    "platform": "auto",
    "runs_dir": ".commbench/runs",
    "scratch": None,
    "rounds": 2,
    "max_rounds": 6,
    "precision": 0.03,
    "reps": 10,
    "warmup": 2,
    "budget": 0.25,
    "max_reps": 200,
    "references": "references",
    "suites": "suites",
}


def setting(config: pytest.Config, name: str, convert=str) -> Any:
    """Command line > environment (COMMBENCH_<NAME>) > ini (commbench_<name>) > default."""
    value = config.getoption(f"commbench_{name}", None)
    if value is not None:
        return value
    env = os.environ.get(f"COMMBENCH_{name.upper()}")
    try:
        if env not in (None, ""):
            return convert(env)
        ini = config.getini(f"commbench_{name}")
        if ini not in (None, "", []):
            return convert(ini)
    except (ValueError, pytest.UsageError) as exc:
        raise pytest.UsageError(f"commbench: bad value for {name}: {exc}") from None
    return DEFAULTS.get(name)


@dataclass
class CommbenchState:
    config: pytest.Config
    model: Any
    platform: Any
    seed: int
    run_id: str
    run_dir: Path
    work_dir: Path  # items' scratch directories (inputs, outputs, jobs)
    references: Path
    suites: Path
    rounds: int
    max_rounds: int
    precision: float
    reps: int
    warmup: int
    budget: float
    max_reps: int
    timeout: float | None
    keep: bool
    exclusive: bool
    log: ResultsLog
    _fingerprint: dict | None = None

    def item_seed(self, nodeid: str) -> int:
        """Per-item seed: the same item gets the same inputs on any worker, in any order."""
        h = hashlib.sha256(f"{self.seed}:{nodeid}".encode()).digest()
        return int.from_bytes(h[:8], "little")

    @property
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = self.platform.fingerprint()
        return self._fingerprint


def _make(config: pytest.Config, kind: str, name: str):
    hook = getattr(config.hook, f"pytest_commbench_make_{kind}")
    obj = hook(config=config, name=name)
    if obj is None:
        if kind == "model":
            names = [n for group in config.hook.pytest_commbench_model_names(config=config)
                     for n in group]
            raise pytest.UsageError(
                f"--commbench-model: unknown model {name!r} (known: {', '.join(names)})")
        from .platforms import NAMES

        raise pytest.UsageError(
            f"--platform: unknown platform {name!r} (known: auto, {', '.join(NAMES)})")
    return obj


def create(config: pytest.Config) -> CommbenchState:
    root = config.rootpath
    workerinput = getattr(config, "workerinput", None)
    seed = setting(config, "seed", int)
    if workerinput and "commbench_seed" in workerinput:
        seed = workerinput["commbench_seed"]
        run_id = workerinput["commbench_run_id"]
    else:
        seed = seed if seed is not None else secrets.randbits(48)
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    runs_dir = Path(setting(config, "runs_dir"))
    if not runs_dir.is_absolute():
        runs_dir = root / runs_dir
    run_dir = runs_dir / run_id
    scratch = setting(config, "scratch")
    work_dir = (Path(scratch) / run_id if scratch else run_dir) / "work"
    model_name = setting(config, "model")
    platform_name = setting(config, "platform")
    if platform_name == "auto":
        platform_name = detect()
    timeout = setting(config, "timeout", float)
    return CommbenchState(
        config=config,
        model=_make(config, "model", model_name),
        platform=_make(config, "platform", platform_name),
        seed=int(seed),
        run_id=run_id,
        run_dir=run_dir,
        work_dir=work_dir,
        references=root / setting(config, "references"),
        suites=root / setting(config, "suites"),
        rounds=int(setting(config, "rounds", int)),
        max_rounds=int(setting(config, "max_rounds", int)),
        precision=float(setting(config, "precision", float)),
        reps=int(setting(config, "reps", int)),
        warmup=int(setting(config, "warmup", int)),
        budget=float(setting(config, "budget", float)),
        max_reps=max(int(setting(config, "max_reps", int)), int(setting(config, "reps", int))),
        timeout=None if timeout is None else float(timeout),
        keep=bool(config.getoption("commbench_keep", False)),
        exclusive=not config.getoption("commbench_shared_node", False),
        log=ResultsLog(run_dir / "results.jsonl"),
    )
