"""`commbench eval FILE --task CATEGORY/TASK [--world N] [--platform P]`: judge one answer file
as an item of a run would (the same build, jobs, checks and timing: `engine.evaluate`), without
laying it out as a `dir:` model or starting a pytest session, and print the result as one JSON
object: whether it compiled, the verdict, the per-size times and the speedup.

The answer is read as a `dir:` model reads its files (the whole file or only its edit regions,
as a model's reply may be). The exit status says the verdict: 0 pass, 1 any other, 2 a usage
error (no such task, a world size the task does not run at, a platform that cannot run it)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from .verdicts import Verdict

#: verdicts reached before the answer was built: it did not compile (or was never built)
UNBUILT = (Verdict.NO_SOLUTION, Verdict.TRUNCATED, Verdict.TAMPERED, Verdict.COMPILE_ERROR)
#: per size, the figures the JSON result keeps
SIZE_KEYS = ("count", "dtype", "bytes", "t_sol_us", "t_ref_us", "speedup", "metric", "unit",
             "value_sol", "value_ref")


class _Watched:
    """The platform, noting each build that succeeds: the answer's is the first, so the
    result can say whether it compiled whatever failed later."""

    def __init__(self, platform) -> None:
        self._platform = platform
        self.built = 0

    def build(self, *args, **kwargs):
        artifact = self._platform.build(*args, **kwargs)
        self.built += 1
        return artifact

    def __getattr__(self, name: str):
        return getattr(self._platform, name)


def add_parser(sub) -> None:
    """Register `commbench eval` on the `commbench` command's subparsers."""
    ev = sub.add_parser("eval", help="judge one answer file for one task (no dir: layout, no "
                                     "pytest session); prints a JSON result")
    ev.add_argument("file", help="the answer: a whole solution file or a reply with its "
                                 "edit regions")
    ev.add_argument("--task", required=True, metavar="CATEGORY/TASK",
                    help="the task's path below the suites folder, e.g. collective/ring_allreduce")
    ev.add_argument("--world", type=int, help="world size (default: the task's smallest)")
    ev.add_argument("--platform", default="auto",
                    help="the platform to run on (default: what --platform=auto picks)")
    ev.add_argument("--suites", default="suites")
    ev.add_argument("--references", default="references",
                    help="the references the answer is timed against")
    ev.add_argument("--check-only", action="store_true",
                    help="correctness only: no reference job, no timing")
    ev.add_argument("--seed", type=int, help="seed of the random inputs (default: a fresh one)")
    ev.add_argument("--unsandboxed", action="store_true",
                    help="run the jobs without their namespaces (as --commbench-unsandboxed)")
    ev.set_defaults(func=cmd_eval)


def _fail(message: str) -> int:
    print(f"commbench eval: {message}", file=sys.stderr)
    return 2


def _task(args: argparse.Namespace):
    """The task named by --task, or the usage error's message."""
    from .tasks import MANIFEST, ManifestError, load_task

    suites = Path(args.suites)
    name = args.task.strip("/")
    manifest = suites / name / MANIFEST
    if not manifest.is_file():
        return None, (f"no task {name!r} in {suites} (no {manifest}); `commbench tasks "
                      f"{suites}` lists them")
    try:
        return load_task(manifest, suites), None
    except ManifestError as exc:
        return None, str(exc)


def _platform(name: str):
    from .platforms import NAMES, detect, make

    chosen = detect() if name == "auto" else name
    try:
        platform = make(chosen)
    except ValueError as exc:
        return None, str(exc)
    if platform is None:
        return None, f"unknown platform {name!r} (known: auto, {', '.join(NAMES)})"
    return platform, None


def result_json(task, world: int, platform_name: str, path: Path, seed: int, built: int,
                result) -> dict[str, Any]:
    """The JSON result of one evaluated answer."""
    from .scoring import band

    compiled = built > 0 or (result.verdict not in UNBUILT
                             and result.verdict != Verdict.INFRA_ERROR)
    return {
        "task": task.relpath, "world": world, "platform": platform_name, "file": str(path),
        "seed": seed, "compiled": compiled, "verdict": result.verdict,
        "message": result.message, "check_only": bool(result.check_only),
        "speedup": result.speedup,
        "speedup_ci90": None if result.speedup_ci90 is None else list(result.speedup_ci90),
        "timing_trust": result.timing_trust,
        "band": band(result.speedup, result.speedup_ci90, result.timing_trust) or None,
        "sizes": [{k: getattr(s, k) for k in SIZE_KEYS} for s in result.sizes],
        "detail": str(result.detail)[-2000:],
        "duration_s": result.duration_s,
    }


def cmd_eval(args: argparse.Namespace) -> int:
    from .engine import RunSettings, Settings, evaluate, produce
    from .models.builtin import _read

    path = Path(args.file)
    if not path.is_file():
        return _fail(f"no answer file {path}")
    task, why = _task(args)
    if task is None:
        return _fail(why)
    world = args.world if args.world is not None else min(task.ranks)
    if world not in task.ranks:
        return _fail(f"{task.relpath} runs at world sizes {', '.join(map(str, task.ranks))}, "
                     f"not {world}")
    platform, why = _platform(args.platform)
    if platform is None:
        return _fail(why)
    skip = platform.skip_reason(task, world)
    if skip:
        return _fail(f"{task.relpath} at {world} ranks cannot run here: {skip}")
    seed = args.seed if args.seed is not None else secrets.randbits(48)
    watched = _Watched(platform)
    with tempfile.TemporaryDirectory(prefix="commbench-eval-") as scratch:
        settings = Settings.for_item(
            RunSettings(check_only=args.check_only, unsandboxed=args.unsandboxed), seed=seed,
            work=Path(scratch) / "work", cache=Path(scratch) / "build",
            # (the jobs never see the references nor the project around them: engine.job)
            references=Path(args.references).resolve())
        result = evaluate(task, world, produce(lambda: _read(path)), watched, settings)
    out = result_json(task, world, platform.name, path, seed, watched.built, result)
    print(json.dumps(out, indent=1, default=str))
    return 0 if result.passed else 1
