"""Finishing a killed run (`--commbench-resume RUN`): its folder, found by id or path; its
seed, shard and name, kept from its run.json (the options may repeat them, not change them);
its log made whole, the items it finished reported from it and the rest run with its seed.

One session at a time uses a run directory (`results.RunLock`, taken here before anything
else; its xdist workers share it): a second `--commbench-resume` of a run whose session
still lives is a usage error naming that session's pid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import shards
from .option_sources import lookup
from .results import ResultsLog, RunBusy, RunLock, finished
from .run_state import RUN_FILE, RunIdentity, read_run_file


def resumed_run(config: pytest.Config, runs_dir: Path, given_seed: int | None,
                model: Any, platform: Any) -> RunIdentity:
    """The run --commbench-resume names, its folder locked for this session, its log ended
    cleanly where the killed session left a line half written."""
    value, where = lookup(config, "resume")
    run_dir = resume_dir(config, runs_dir, value, where)
    run_id = run_dir.name
    run_lock = RunLock(run_dir)
    config.add_cleanup(run_lock.release)
    _hold(run_lock, run_id, where)
    seed, info = resumed_seed(run_dir, given_seed, where)
    shard, run_name = resumed_shard(config, run_id, info)
    for key, now in (("model", model.name), ("platform", platform.name)):
        if info.get(key) not in (None, now):
            raise pytest.UsageError(
                f"{where}: run {run_id} is of {key} {info[key]!r}, not {now!r}")
    log = ResultsLog(run_dir / "results.jsonl")
    log.end_cleanly()
    resume_upto = log.path.stat().st_size if log.path.exists() else 0
    return RunIdentity(seed=seed, run_id=run_id, run_dir=run_dir, run_lock=run_lock,
                       shard=shard, run_name=run_name, resume_upto=resume_upto)


def _hold(run_lock: RunLock, run_id: str, where: str) -> None:
    """The run's lock, taken before its log is touched: one session per run folder."""
    try:
        run_lock.hold()
    except RunBusy as exc:
        raise pytest.UsageError(f"{where}: run {run_id} cannot be resumed now: "
                                f"{exc}") from None
    except OSError as exc:
        raise pytest.UsageError(f"{where}: run {run_id} cannot be resumed: its "
                                f"folder cannot be locked ({exc})") from None


def resume_dir(config: pytest.Config, runs_dir: Path, value: str, where: str) -> Path:
    path = Path(value).expanduser()
    for candidate in ([path] if path.is_absolute() else
                      [config.invocation_params.dir / path, runs_dir / path]):
        if candidate.is_dir():
            return candidate.resolve()
    raise pytest.UsageError(f"{where}: no run {value!r} to resume (neither a run directory "
                            f"nor a run id under {runs_dir})")


def resumed_seed(run_dir: Path, given: int | None, where: str) -> tuple[int, dict]:
    """The seed of the run being resumed (from run.json, else from its result lines)."""
    info = read_run_file(run_dir / RUN_FILE) or {}
    seed = info.get("seed")
    log = run_dir / "results.jsonl"
    if seed is None and log.exists():
        seeds = {r.seed for r in finished(log).values() if r.seed is not None}
        seed = seeds.pop() if len(seeds) == 1 else None
    if seed is None:
        if given is None:
            raise pytest.UsageError(f"{where}: the seed of run {run_dir.name} is unknown (no "
                                    f"{RUN_FILE}); give it with --commbench-seed")
        return given, info
    if given is not None and int(given) != int(seed):
        raise pytest.UsageError(f"{where}: run {run_dir.name} has seed {seed}, not {given}: a "
                                "resumed run keeps its seed (leave --commbench-seed out)")
    return int(seed), info



def resumed_shard(config: pytest.Config, run_id: str,
                   info: dict) -> tuple[shards.Shard | None, str | None]:
    """A resumed run keeps the shard and name its run.json records (given ones must agree)."""
    recorded, recorded_name = shards.of(info), info.get(shards.NAME_KEY)
    given, where = lookup(config, "shard")
    if given is not None and given != recorded:
        was = f"shard {recorded}" if recorded else "a run of every selected item (no shard)"
        raise pytest.UsageError(f"{where}: run {run_id} is {was}, not shard {given}: a resumed "
                                "run keeps its part (leave --commbench-shard out)")
    name, name_where = lookup(config, "run_name")
    if name is not None and name != recorded_name:
        raise pytest.UsageError(f"{name_where}: run {run_id} is named {recorded_name!r}, not "
                                f"{name!r}: a resumed run keeps its name")
    return recorded, recorded_name
