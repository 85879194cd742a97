"""The model, the platform and the agent a run names, made through the plugin's hooks
(`pytest_commbench_make_model`, `_platform`, `_agent`; a name no maker knows is a usage error
listing the known ones), and the platform set up from the options that place its jobs:
ranks per GPU, the nodes, compile-only, the ThunderKittens headers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from . import nodes
from .option_sources import given, lookup, setting
from .platforms import NAMES, PROFILES, detect
from .run_state import KnownNames
from .tasks import VENDORS
from .toolchains.nvidia import thunderkittens_include

AGENT_NAMES = ("geak",)  # the built-in agents (agent.py)


def make(config: pytest.Config, kind: str, name: str, where: str):
    """What the `pytest_commbench_make_<kind>` hook makes of `name` (`where`: the option as
    given, for the usage error)."""
    hook = getattr(config.hook, f"pytest_commbench_make_{kind}")
    try:
        obj = hook(config=config, name=name)
    except ValueError as exc:  # a name the maker knows, with a value it cannot use
        raise pytest.UsageError(f"{where}: {exc}") from None
    if obj is None:
        if kind == "model":
            names = [n for group in config.hook.pytest_commbench_model_names(config=config)
                     for n in group]
            raise pytest.UsageError(
                f"{where}: unknown model {name!r} (known: {', '.join(names)})")
        if kind == "agent":
            raise pytest.UsageError(
                f"{where}: unknown agent {name!r} (known: off, {', '.join(AGENT_NAMES)})")
        raise pytest.UsageError(
            f"{where}: unknown platform {name!r} (known: auto, {', '.join(NAMES)})")
    return obj


def make_model_and_platform(config: pytest.Config) -> tuple[Any, Any]:
    """--commbench-model's model and --platform's platform (auto: this machine's)."""
    model_name, model_where = lookup(config, "model")
    platform_name, platform_where = lookup(config, "platform")
    if platform_name == "auto":
        platform_name = detect()
    model = make(config, "model", model_name, model_where)
    platform = make(config, "platform", platform_name, platform_where)
    return model, platform


def make_agent(config: pytest.Config) -> Any:
    """--commbench-agent's agent, or None (off: direct prompting)."""
    agent_name, agent_where = lookup(config, "agent")
    if agent_name and agent_name.strip().lower() not in ("off", "none"):
        return make(config, "agent", agent_name.strip(), agent_where)
    return None


def set_up_platform(config: pytest.Config, platform: Any) -> None:
    """The options that say where and how the platform runs jobs, set on it (a usage error
    where one does not fit it)."""
    _warn_unprofiled(config, platform)
    per_gpu, per_gpu_where = lookup(config, "ranks_per_gpu")
    if int(per_gpu) > 1:
        if not platform.has_gpus:
            raise pytest.UsageError(
                f"{per_gpu_where}: ranks per GPU is a placement of GPU platforms; platform "
                f"{platform.name} has no GPUs")
        platform.place(int(per_gpu), int(lookup(config, "jobs_per_gpu")[0]))
    platform.node_placement = node_placement(config)
    if lookup(config, "compile_only")[0]:
        platform.compile_only = True  # nothing runs: a platform without its devices still builds
    _find_thunderkittens(config, platform)


def _warn_unprofiled(config: pytest.Config, platform: Any) -> None:
    """A warning where no profile of the benchmark names this machine's GPUs."""
    profile = platform.profile
    if profile is not None and profile.name not in PROFILES:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"no profile of the benchmark describes this machine's {profile.model}: platform "
            f"{profile.name} is made from its own properties ({profile.arch}, "
            f"{profile.gpus_per_node} GPUs, {profile.interconnect}; features "
            f"{', '.join(sorted(profile.features))}) and runs the {profile.vendor} tasks whose "
            "requirements it meets"), stacklevel=2)


def _find_thunderkittens(config: pytest.Config, platform: Any) -> None:
    """--commbench-thunderkittens (or COMMBENCH_THUNDERKITTENS, or the ini key), handed to the
    platform, which builds and lists features with it; a folder without the headers is a
    usage error."""
    tk, tk_where = lookup(config, "thunderkittens")
    if not tk:
        return
    platform.thunderkittens = Path(tk).expanduser().resolve()
    if thunderkittens_include(platform.thunderkittens) is None:
        raise pytest.UsageError(f"{tk_where}: no ThunderKittens headers (kittens.cuh) in "
                                f"{tk} or its include/ folder")


def _flux_output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def node_placement(config: pytest.Config):
    """Where jobs' ranks run (`nodes.resolve`): None where every job stays on this node."""
    names = ("launcher", "hostfile", "ranks_per_node")
    values = {name: setting(config, name) for name in names}
    hostfile = values["hostfile"]
    if hostfile:
        hostfile = str(config.invocation_params.dir / Path(hostfile).expanduser())
    try:
        return nodes.resolve(values["launcher"], hostfile, values["ranks_per_node"],
                             os.environ, sandboxed=not setting(config, "unsandboxed"),
                             run=_flux_output)
    except nodes.PlacementError as exc:
        named = [lookup(config, name)[1] for name in names if given(config, name)]
        where = ", ".join(named) or "the batch system's allocation"
        raise pytest.UsageError(f"{where}: {exc}") from None


def known_platforms(config: pytest.Config, platform: Any) -> KnownNames:
    """Platform names a manifest may list: the built-ins, the one in use, any a plugin makes."""
    return KnownNames(
        NAMES, platform.name,
        lambda name: config.hook.pytest_commbench_make_platform(config=config, name=name) is not None)


def known_vendors(platform: Any) -> KnownNames:
    """Vendor names a manifest may list: the tasks' and the profiles', and the one in use."""
    return KnownNames({*VENDORS, *(p.vendor for p in PROFILES.values())}, platform.vendor)
