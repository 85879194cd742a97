"""The session's run, made once at configure time (`create`): the model and platform the
options name, the run it is (fresh, resumed, or its xdist controller's) and its folders.

Each job has a module of its own, named for it: option_values.py (how an option's text
becomes its value), options.py (the option table), option_sources.py (command line >
environment > ini > default), makers.py (model, platform and agent through the hooks),
run_state.py (the run's state and run.json), resume.py (finishing a killed run). Their names
stay importable from here.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

from . import shards
from .makers import (
    AGENT_NAMES,
    known_platforms,
    known_vendors,
    make_agent,
    make_model_and_platform,
    set_up_platform,
)
from .option_sources import given, lookup, renamed, setting
from .options import (
    ALIASES,
    DEFAULTS,
    FLAGS,
    GROUPS,
    OPTIONS,
    PARSERS,
    Option,
    flag_name,
    group_of,
    labelled,
)
from .results import ResultsLog, RunLock
from .resume import resumed_run
from .run_state import RUN_FILE, STATE, CommbenchState, KnownNames, RunIdentity
from .settings import RunSettings

__all__ = [
    "AGENT_NAMES", "ALIASES", "DEFAULTS", "FLAGS", "GROUPS", "OPTIONS", "PARSERS", "RUN_FILE",
    "STATE", "CommbenchState", "KnownNames", "Option", "create", "flag_name", "given",
    "group_of", "labelled", "lookup", "renamed", "setting",
]


def create(config: pytest.Config) -> CommbenchState:
    """The run's state: each part below raises a usage error, before any item runs, where an
    option does not fit (in this order: the runs folder, the model and platform, the run, its
    folders, the agent)."""
    given_seed = setting(config, "seed")
    worker = _is_worker(config)
    runs_dir = _runs_dir(config, check=not worker)
    model, platform = make_model_and_platform(config)
    set_up_platform(config, platform)
    if worker:
        run = _worker_run(config)
    elif setting(config, "resume"):
        run = resumed_run(config, runs_dir, given_seed, model, platform)
    else:
        run = _fresh_run(config, runs_dir, given_seed)
    work_dir, build_dir = _run_folders(config, run, check=not worker)
    state = CommbenchState(
        config=config,
        model=model,
        platform=platform,
        seed=int(run.seed),
        run_id=run.run_id,
        run_dir=run.run_dir,
        # the run's own runs folder: a resumed run (given by its path) keeps using the replies
        # kept beside it, whatever --commbench-runs-dir says now (a worker: its controller's)
        runs_dir=run.run_dir.parent,
        work_dir=work_dir,
        build_dir=build_dir,
        references=config.rootpath / setting(config, "references"),
        suites=config.rootpath / setting(config, "suites"),
        settings=RunSettings.from_options(lambda name: setting(config, name)),
        log=ResultsLog(run.run_dir / "results.jsonl",
                       # a worker shares its controller's hold from its first line on
                       before_write=run.run_lock.join if worker else None),
        resume_upto=run.resume_upto,
        run_lock=run.run_lock,
        shard=run.shard,
        run_name=run.run_name,
    )
    state.agent = make_agent(config)
    state.known_platforms = known_platforms(config, platform)
    state.known_vendors = known_vendors(platform)
    return state


def _is_worker(config: pytest.Config) -> bool:
    """An xdist worker of a commbench run: its controller made the run and handed it over."""
    workerinput = getattr(config, "workerinput", None)
    return bool(workerinput and "commbench_seed" in workerinput)


def _runs_dir(config: pytest.Config, check: bool) -> Path:
    """--commbench-runs-dir, under the rootdir where relative; checked writable (`check`)."""
    runs_dir = Path(setting(config, "runs_dir")).expanduser()
    if not runs_dir.is_absolute():
        runs_dir = config.rootpath / runs_dir
    if check:
        _check_writable(runs_dir, "runs folder", lookup(config, "runs_dir")[1])
    return runs_dir


def _worker_run(config: pytest.Config) -> RunIdentity:
    """An xdist worker's run: its controller's, as the controller handed it over."""
    workerinput = config.workerinput
    run_dir = Path(workerinput["commbench_run_dir"])
    run_lock = RunLock(run_dir)  # joined at the worker's first line (see `create`)
    config.add_cleanup(run_lock.release)
    return RunIdentity(seed=workerinput["commbench_seed"],
                       run_id=workerinput["commbench_run_id"], run_dir=run_dir,
                       run_lock=run_lock,
                       shard=_shard_given(workerinput.get("commbench_shard")),
                       run_name=workerinput.get("commbench_run_name"),
                       resume_upto=workerinput.get("commbench_resume_upto"))


def _fresh_run(config: pytest.Config, runs_dir: Path, given_seed: int | None) -> RunIdentity:
    """A new run: the given seed or a fresh secret one, a new id under the runs folder."""
    seed = given_seed if given_seed is not None else secrets.randbits(48)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    run_dir = runs_dir / run_id
    run_lock = RunLock(run_dir)  # taken when the run's file is written
    config.add_cleanup(run_lock.release)
    shard, run_name = _fresh_shard(config)
    return RunIdentity(seed=seed, run_id=run_id, run_dir=run_dir, run_lock=run_lock,
                       shard=shard, run_name=run_name)


def _run_folders(config: pytest.Config, run: RunIdentity, check: bool) -> tuple[Path, Path]:
    """Where the run's jobs work (--commbench-scratch, else the run's folder) and where its
    builds go (--commbench-build-cache, else the run's folder); checked writable (`check`)."""
    scratch = setting(config, "scratch")
    work_dir = (Path(scratch).expanduser() / run.run_id if scratch else run.run_dir) / "work"
    if check:
        _check_writable(work_dir, "folder of the run's jobs",
                        lookup(config, "scratch")[1] if scratch else
                        lookup(config, "runs_dir")[1])
    build_cache = setting(config, "build_cache")
    build_dir = Path(build_cache).expanduser() if build_cache else run.run_dir / "build"
    if build_cache and check:
        _check_writable(build_dir, "build cache", lookup(config, "build_cache")[1])
    return work_dir, build_dir


def _shard_given(text: str | None) -> shards.Shard | None:
    return shards.parse(text) if text else None


def _fresh_shard(config: pytest.Config) -> tuple[shards.Shard | None, str | None]:
    """The shard of a new run and the name its shards share (a shard of several needs one:
    without it the report cannot tell which shards make one run)."""
    shard, where = lookup(config, "shard")
    name = setting(config, "run_name") or shards.default_name()
    if shard is not None and shard.count > 1 and not name:
        raise pytest.UsageError(
            f"{where}: give the shards of this run a name they all share "
            "(--commbench-run-name NAME, the same for every shard; inside a Slurm job array it "
            "is slurm-<array job id>): `commbench report` merges the shards of one name")
    return shard, name


def _check_writable(path: Path, what: str, where: str) -> None:
    """A usage error, before any item runs, where the run cannot write `path` (a folder it
    makes and writes into): the nearest folder of it that exists must take a new folder
    (one is made there and removed at once; nothing is left behind, even when collecting)."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a folder")
        import tempfile

        os.rmdir(tempfile.mkdtemp(prefix=".commbench-probe-", dir=existing))
    except OSError as exc:
        raise pytest.UsageError(
            f"{where}: the {what} {path} cannot be written ({exc.__class__.__name__}: "
            f"{exc.strerror or exc}); give a folder this user can write to") from None
