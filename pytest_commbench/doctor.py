"""`commbench doctor`: what this machine has for the benchmark, what it lacks, and which
items of the suites that leaves runnable on a platform (the same skip rules the items use).

Every check is read-only and quick (version strings, file lookups, `nvidia-smi`); nothing is
built or launched except the sandbox's own probe (one empty namespace)."""

from __future__ import annotations

import importlib.metadata
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from . import __version__

Line = tuple[str, str, str]  # (what, found or missing, detail)


def _package(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def checks(platform_name: str | None = None) -> list[Line]:
    """What every platform needs (Python, MPI, the packages, the job sandbox), then what the
    platform `platform_name` needs (its `doctor_rows`: the vendor's GPUs, compiler and
    libraries). The CPU platform needs no more: there each vendor's GPUs are listed, and
    `--platform NAME` lists what a GPU platform needs."""
    from .launch import find_mpiexec, mpi_version
    from .platforms import VENDOR_MODULES, detect, make
    from .sandbox import probe

    out: list[Line] = [("python", "found", sys.version.split()[0]),
                       ("pytest-commbench", "found", __version__)]
    mpiexec = find_mpiexec()
    out.append(("mpiexec", "found" if mpiexec else "missing",
                f"{mpiexec} ({mpi_version()})" if mpiexec else
                "install an MPI (pip install -e '.[mpi]' brings Open MPI)"))
    for pkg, why in (("mpi4py", "the harness's MPI"), ("numpy", "inputs and checks"),
                     ("openai", "OpenAI-compatible models (pip install -e '.[models]')"),
                     ("anthropic", "Anthropic models (pip install -e '.[models]')"),
                     ("genai-prices", "model prices")):
        version = _package(pkg)
        out.append((pkg, "found" if version else "missing", version or why))
    why_not = probe()
    out.append(("job sandbox", "found" if why_not is None else "missing",
                "Linux namespaces (unshare)" if why_not is None else
                f"{why_not}; --commbench-unsandboxed runs without one"))
    auto = detect()
    platform = make(platform_name or auto)
    if platform is None:
        raise ValueError(f"unknown platform {platform_name!r}")
    own = platform.doctor_rows()
    if own:
        out += own
    else:  # the CPU platform: which GPUs are here, for the GPU platforms
        out += [module.gpus_row() for module in VENDOR_MODULES.values()]
    out.append(("platform auto", "found", auto))
    return out


def runnable(platform_name: str, suites: Path, ranks_per_gpu: int = 1,
             compile_only: bool = False) -> tuple[int, Counter, list[str]]:
    """(items runnable, skips by reason, manifest errors) of the suites on a platform (with
    `compile_only`: the items whose answers it can build, as --commbench-compile-only)."""
    from .platforms import make
    from .tasks import load_suite

    platform = make(platform_name)
    if platform is None:
        raise ValueError(f"unknown platform {platform_name!r}")
    platform.compile_only = compile_only
    if ranks_per_gpu > 1 and platform.has_gpus:
        platform.place(ranks_per_gpu)
    ok, skips = 0, Counter()
    tasks, errors = load_suite(suites)
    for task in tasks:
        for world in task.ranks:
            why = platform.skip_reason(task, world)
            if why is None:
                ok += 1
            elif not why.startswith("task runs on"):  # another platform's task: not a gap
                skips[why] += 1
    return ok, skips, errors


def report(platform_name: str | None, suites: Path, ranks_per_gpu: int,
           write: Callable[[str], None] = print) -> int:
    """Print the checks and what they leave runnable; 0 when at least one item can run."""
    from tabulate import tabulate

    from .platforms import NAMES, GpuPlatform, detect, make

    name = platform_name or detect()
    lines = checks(name)
    write(tabulate(lines, headers=["what", "", "detail"]))
    ok, skips, errors = runnable(name, suites, ranks_per_gpu)
    write("")
    write(f"platform {name}: {ok} item{'s' * (ok != 1)} of {suites} can run here"
          + (f" (ranks per GPU {ranks_per_gpu})" if ranks_per_gpu > 1 else ""))
    for why, n in skips.most_common():
        write(f"  {n} skipped: {why}")
    for error in errors:
        write(f"  broken manifest: {error}")
    platform = make(name)
    if isinstance(platform, GpuPlatform):  # its answers build wherever its compiler is
        built, not_built, _ = runnable(name, suites, ranks_per_gpu, compile_only=True)
        write(f"--commbench-compile-only builds every answer for {name} "
              f"({platform.profile.arch}) and stops there, no GPU needed: {built} "
              f"item{'s' * (built != 1)} of {suites} can be built here")
        for why, n in not_built.most_common():
            write(f"  {n} not built: {why}")
    else:
        write("commbench doctor --platform NAME lists what a GPU platform needs (NAME: "
              + ", ".join(n for n in NAMES if n != "cpu") + ")")
    return 0 if ok else 1
