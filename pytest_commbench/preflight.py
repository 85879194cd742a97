"""What is wrong with a run before its first item: one line each, before anything is spent.

Refusals (a usage error, exit status 4): a platform named explicitly whose devices this machine
does not show, a model that must be asked and has no API key or whose provider's SDK does not
import. Warnings: options that do nothing for the model or platform chosen, options given
under a former name. And after the session: a benchmark session in which no item ran is not
a success (`no_item_ran`)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .models.conversation import _safe
from .option_sources import given, lookup, renamed, setting
from .options import flag_name
from .record import ResultLine
from .verdicts import Verdict

#: options that only models which can be asked use (their reason, for the warning)
ASKED_ONLY = ("rounds", "samples", "temperature", "budget_usd", "base_url", "regenerate",
              "request_timeout", "max_tokens", "agent")
#: options of the timing, which --commbench-check-only switches off
TIMING = ("timing_rounds", "timing_max_rounds", "timing_precision", "timing_contended", "reps",
          "warmup",
          "timing_budget", "max_reps", "timing_wall", "shared_node")


def refusals(config: pytest.Config, state: Any) -> list[str]:
    lines = []
    platform = state.platform
    name, where = lookup(config, "platform")
    if given(config, "platform") and str(name) != "auto" \
            and platform.visible_gpus() == 0 and not setting(config, "compile_only"):
        profile = platform.profile
        what = f"{profile.model} GPUs" if profile is not None else "devices"
        lines.append(f"{where}: platform {platform.name} needs {what}, and none is visible on "
                     f"this machine{_visibility_hint(platform.vendor)}; "
                     "--platform=auto (the default) runs what this machine has, and "
                     "--commbench-compile-only builds for it without running")
    for missing in (_missing_key(config, state), _missing_sdk(config, state)):
        if missing:
            lines.append(missing)
    return lines


def _visibility_hint(vendor: str = "nvidia") -> str:
    if vendor == "amd":
        from .platforms import amd

        found = amd.gpus()
        set_ = [f"{n}={os.environ[n]!r}" for n in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
                if n in os.environ]
        if not found:
            return f" (no AMD GPU in the kernel's KFD topology, {amd.KFD_NODES}, nor from rocminfo)"
        return (f" (the KFD topology has {', '.join(sorted({g.model for g in found}))}"
                + (f"; {', '.join(set_)}" if set_ else "") + ")")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f" (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None else ""


def _replays(config: pytest.Config, state: Any) -> bool:
    """Are replies kept by an earlier run there to be judged without a request?"""
    kept = Path(state.runs_dir) / "replies" / _safe(state.model.name)
    return not setting(config, "regenerate") and kept.is_dir() and \
        next(kept.rglob("reply.md"), None) is not None


def _missing_key(config: pytest.Config, state: Any) -> str | None:
    spec = getattr(state.model, "spec", None)
    key_env = getattr(spec, "key_env", None)
    if not key_env or os.environ.get(key_env) or _replays(config, state):
        return None
    where = lookup(config, "model")[1]
    return (f"{where}: model {state.model.name} is asked through {key_env}, which is not set "
            f"(export {key_env}=... before the run)")


def _missing_sdk(config: pytest.Config, state: Any) -> str | None:
    """The provider's SDK must import before the first item: without it every item would fail
    alike, one by one. (Imported here, once: the first request imports it anyway.)"""
    spec = getattr(state.model, "spec", None)
    provider = getattr(spec, "provider", None)
    if not provider or _replays(config, state):
        return None
    import importlib

    from .models.providers import sdk_missing

    try:
        importlib.import_module(provider)
    except ImportError as exc:
        return f"{lookup(config, 'model')[1]}: model {state.model.name}: {sdk_missing(provider, exc)}"
    return None


def warnings(config: pytest.Config, state: Any) -> list[str]:
    lines = list(renamed(config))
    model = state.model
    asked = getattr(model, "spec", None) is not None
    for name in ASKED_ONLY:
        if given(config, name) and not asked:
            lines.append(f"{flag_name(name)} does nothing for model {model.name}: only models "
                         "that are asked (registry names, openai:ID, anthropic:ID) use it")
    if setting(config, "check_only"):
        for name in TIMING:
            if given(config, name):
                lines.append(f"{flag_name(name)} does nothing with --commbench-check-only "
                             "(nothing is timed)")
    if not state.platform.has_gpus and given(config, "gpu_batch"):
        lines.append(f"{flag_name('gpu_batch')} does nothing on platform {state.platform.name} "
                     "(CPU jobs batch short calls anyway)")
    if given(config, "jobs_per_gpu") and int(setting(config, "ranks_per_gpu")) == 1:
        lines.append(f"{flag_name('jobs_per_gpu')} does nothing without "
                     f"{flag_name('ranks_per_gpu')} above 1 (jobs share a GPU only under MPS)")
    if not state.platform.has_gpus and given(config, "shared_node"):
        lines.append(f"{flag_name('shared_node')} does nothing on platform "
                     f"{state.platform.name} (it leases GPUs)")
    return lines


def check(config: pytest.Config, state: Any) -> None:
    """At configure, on the process that runs the session (not an xdist worker)."""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    bad = refusals(config, state)
    if bad:
        raise pytest.UsageError("\n".join(bad))
    for line in warnings(config, state):
        config.issue_config_time_warning(pytest.PytestConfigWarning(line), stacklevel=2)


def no_item_ran(records: list[ResultLine]) -> str | None:
    """Why a benchmark session ran nothing (every item skipped), or None."""
    if not records or any(r.verdict != Verdict.SKIPPED for r in records):
        return None
    reasons = Counter(str(r.result.message or "skipped") for r in records)
    listed = "; ".join(f"{n} x {why}" for why, n in reasons.most_common())
    return f"no benchmark item ran: all {len(records)} skipped ({listed})"
