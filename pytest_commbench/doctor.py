"""`commbench doctor`: what this machine has for the benchmark, what it lacks, and which
items of the suites that leaves runnable on a platform (the same skip rules the items use).

Every check is read-only and quick (version strings, file lookups, `nvidia-smi`); nothing is
built or launched except the sandbox's own probe (one empty namespace)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
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


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc.__class__.__name__})"
    text = (done.stdout or done.stderr).strip().splitlines()
    return next((x for x in text if "release" in x or "version" in x.lower()),
                text[0] if text else "")


def checks() -> list[Line]:
    from .build import cuda_runtime_dir, find_cuda_libs
    from .cupti_guard import find_cupti
    from .launch import find_mpiexec, mpi_version
    from .platforms import detect
    from .platforms.nvidia import mps_control, nvidia_gpus
    from .sandbox import probe

    out: list[Line] = [("python", "found", sys.version.split()[0]),
                       ("pytest-commbench", "found", __version__)]
    mpiexec = find_mpiexec()
    out.append(("mpiexec", "found" if mpiexec else "missing",
                f"{mpiexec} ({mpi_version()})" if mpiexec else
                "install an MPI (pip install -e '.[mpi]' brings Open MPI)"))
    for pkg, why in (("mpi4py", "the harness's MPI"), ("numpy", "inputs and checks"),
                     ("cupy-cuda13x", "CuPy tasks and GPU buffers (pip install -e '.[gpu]')"),
                     ("openai", "OpenAI-compatible models (pip install -e '.[models]')"),
                     ("anthropic", "Anthropic models (pip install -e '.[models]')"),
                     ("genai-prices", "model prices")):
        version = _package(pkg) or (_package("cupy") if pkg == "cupy-cuda13x" else None)
        out.append((pkg, "found" if version else "missing", version or why))
    why_not = probe()
    out.append(("job sandbox", "found" if why_not is None else "missing",
                "Linux namespaces (unshare)" if why_not is None else
                f"{why_not}; --commbench-unsandboxed runs without one"))
    gpus = nvidia_gpus()
    out.append(("NVIDIA GPUs", "found" if gpus else "missing",
                ", ".join(f"{g.get('name', '?')}" for g in gpus) if gpus else
                "nvidia-smi lists none (the CPU platform still runs)"))
    if gpus:
        out.append(("driver", "found", gpus[0].get("driver", "")))
    nvcc = shutil.which("nvcc")
    out.append(("nvcc", "found" if nvcc else "missing",
                f"{nvcc}: {_first_line([nvcc, '--version'])}" if nvcc else
                "the CUDA toolkit's compiler, for the CUDA tasks"))
    runtime = cuda_runtime_dir()
    out.append(("CUDA runtime", "found" if runtime else "missing", str(runtime or "libcudart")))
    libs = find_cuda_libs()
    out.append(("NCCL", "found" if libs.nccl_include else "missing",
                f"{libs.nccl_version} ({libs.nccl_include})" if libs.nccl_include else
                "headers and library (pip install -e '.[gpu]' brings nvidia-nccl-cu13)"))
    out.append(("NVSHMEM", "found" if libs.nvshmem_include else "missing",
                f"{libs.nvshmem_version} ({libs.nvshmem_include})" if libs.nvshmem_include
                else "headers and library (nvidia-nvshmem-cu13)"))
    cupti = find_cupti()
    out.append(("CUPTI", "found" if cupti else "missing",
                "the run-time guard of CUDA tasks" if cupti else
                "without it, forbidden CUDA calls are checked by symbol only"))
    control = mps_control()
    out.append(("MPS control", "found" if control else "missing",
                control or "needed only with --commbench-ranks-per-gpu"))
    out.append(("platform auto", "found", detect()))
    return out


def runnable(platform_name: str, suites: Path, ranks_per_gpu: int = 1
             ) -> tuple[int, Counter, list[str]]:
    """(items runnable, skips by reason, manifest errors) of the suites on a platform."""
    from .platforms import make
    from .tasks import load_suite

    platform = make(platform_name)
    if platform is None:
        raise ValueError(f"unknown platform {platform_name!r}")
    if ranks_per_gpu > 1 and hasattr(platform, "place"):
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

    from .platforms import detect

    lines = checks()
    write(tabulate(lines, headers=["what", "", "detail"]))
    name = platform_name or detect()
    ok, skips, errors = runnable(name, suites, ranks_per_gpu)
    write("")
    write(f"platform {name}: {ok} item{'s' * (ok != 1)} of {suites} can run here"
          + (f" (ranks per GPU {ranks_per_gpu})" if ranks_per_gpu > 1 else ""))
    for why, n in skips.most_common():
        write(f"  {n} skipped: {why}")
    for error in errors:
        write(f"  broken manifest: {error}")
    return 0 if ok else 1
