"""NVIDIA's toolchain: nvcc builds a CUDA solution, or a HIP one through the project's
HIP->CUDA header (platform h200-hip), into a shared object by the harness's recipe, with the
NCCL, NVSHMEM and NVML of this machine (the nvidia-* Python packages first, then the system)
and, for the ThunderKittens tasks, the headers COMMBENCH_THUNDERKITTENS names. The device code
nvcc generated is searched for NVLink multicast, and the symbols the library links are checked
against the task's `forbid` patterns, as `build` checks every native build.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..build import (
    INCLUDE_DIR,
    Artifact,
    _built,
    _compile,
    _headers_digest,
    digest,
    forbidden_uses,
    linked_names,
    native_forbid,
    task_forbid,
)
from ..tasks import Task
from ..verdicts import Rejected, Verdict

CUDA_RECIPE_VERSION = "cu-2"
# HIP on an NVIDIA GPU (platform h200-hip): the project's HIP->CUDA header, first on nvcc's
# include path
HIP_ON_CUDA_DIR = INCLUDE_DIR / "hip_on_cuda"
# NVLink multicast instructions: never allowed on these machines (a fault in them can take a
# shared GPU out of service); found in the device code the compiler generated, so no spelling
# of the source (macros, string concatenation in asm, a library header's template) hides them
DEVICE_FORBIDDEN = ("multimem.",)
DEVICE_FINDINGS = "device-forbidden.txt"  # beside a cached build: what its device code used
THUNDERKITTENS_ENV = "COMMBENCH_THUNDERKITTENS"


def uses_thunderkittens(task: Task) -> bool:
    return "thunderkittens" in {task.library, *task.requires}


def thunderkittens_include(root: str | Path | None = None) -> Path | None:
    """The ThunderKittens headers (`kittens.cuh`) in `root` (the repository's root or its
    include/ folder: a run's --commbench-thunderkittens, handed down by its platform), else in
    the folder COMMBENCH_THUNDERKITTENS names; None where there are none."""
    root = root or os.environ.get(THUNDERKITTENS_ENV)
    if not root:
        return None
    for folder in (Path(root) / "include", Path(root)):
        if (folder / "kittens.cuh").is_file():
            return folder.resolve()
    return None


@dataclass(frozen=True)
class CudaLibs:
    """Where NCCL and NVSHMEM headers and libraries are: the nvidia-* Python packages first,
    then the system."""

    nccl_include: Path | None
    nccl_lib: Path | None
    nccl_version: str
    nvshmem_include: Path | None
    nvshmem_lib: Path | None
    nvshmem_version: str


def _package_dir(name: str) -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec(f"nvidia.{name}")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _define(header: Path, names: list[str]) -> str:
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return "unknown"
    parts = []
    for n in names:
        m = re.search(rf"#define\s+{n}\s+(\d+)", text)
        parts.append(m.group(1) if m else "?")
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def find_cuda_libs() -> CudaLibs:
    nccl = _package_dir("nccl")
    nccl_inc = nccl / "include" if nccl and (nccl / "include" / "nccl.h").exists() else None
    if nccl_inc is None and Path("/usr/include/nccl.h").exists():
        nccl_inc = Path("/usr/include")
    nccl_lib = nccl / "lib" if nccl and (nccl / "lib").is_dir() else None
    shmem = _package_dir("nvshmem")
    shmem_inc = shmem / "include" if shmem and (shmem / "include").is_dir() else None
    shmem_lib = shmem / "lib" if shmem and (shmem / "lib").is_dir() else None
    return CudaLibs(
        nccl_inc, nccl_lib,
        _define(nccl_inc / "nccl.h", ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"]) if nccl_inc else "none",
        shmem_inc, shmem_lib,
        _define(shmem_inc / "non_abi" / "nvshmem_version.h",
                ["NVSHMEM_VENDOR_MAJOR_VERSION", "NVSHMEM_VENDOR_MINOR_VERSION",
                 "NVSHMEM_VENDOR_PATCH_VERSION"]) if shmem_inc else "none",
    )


@functools.lru_cache(maxsize=1)
def cuda_runtime_dir() -> Path | None:
    """The folder of libcudart.so of the nvcc in use (for the solution's rpath)."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]))
    nvcc = shutil.which(os.environ.get("COMMBENCH_NVCC", "nvcc"))
    if nvcc:
        real = Path(nvcc).resolve()
        try:  # a wrapper script: `exec /usr/local/cuda-X/bin/nvcc "$@"`
            m = re.search(r"exec\s+(\S+/bin/nvcc)", real.read_text(errors="ignore")[:4096])
            if m:
                real = Path(m.group(1)).resolve()
        except OSError:
            pass
        candidates.append(real.parent.parent)
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    for home in candidates:
        for sub in ("lib64", "targets/x86_64-linux/lib", "lib"):
            if (home / sub / "libcudart.so").exists() or any((home / sub).glob("libcudart.so.*")):
                return home / sub
    return None


@functools.cache
def driver_library(soname: str) -> Path | None:
    """A library of the NVIDIA driver (libnvidia-ml.so.1, libcuda.so.1), from the loader cache
    or the usual driver folders; None where no driver is installed (CI)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    m = re.search(re.escape(soname) + r" \(libc6,x86-64\) => (\S+)", out)
    if m:
        return Path(m.group(1))
    for folder in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
        if (Path(folder) / soname).exists():
            return Path(folder) / soname
    return None


def nvml_library() -> Path | None:
    """The driver's libnvidia-ml.so.1."""
    return driver_library("libnvidia-ml.so.1")


def cuda_command(task: Task, source: Path, output: Path, arch: str,
                 thunderkittens: str | Path | None = None) -> list[str]:
    """The hidden recipe: flags, include and library paths are the harness's, never the model's.
    A HIP task is compiled as CUDA with the HIP->CUDA header first on the include path.
    `thunderkittens`: where the ThunderKittens headers are (see `thunderkittens_include`)."""
    libs = find_cuda_libs()
    uses = {task.library, *task.requires}
    std = "-std=c++17"
    tk = thunderkittens_include(thunderkittens) if "thunderkittens" in uses else None
    if tk is not None:
        # ThunderKittens: C++20, the Hopper feature set (wgmma, TMA: sm_90a), its own macros
        std = "-std=c++20"
        arch = arch + "a" if arch == "sm_90" else arch
    cmd = [os.environ.get("COMMBENCH_NVCC", "nvcc"), "-O3", std, f"-arch={arch}",
           "-Xcompiler", "-fPIC", "-shared", "-cudart", "shared", "-lineinfo"]
    if task.language == "hip":
        cmd += ["-x", "cu", "-I", str(HIP_ON_CUDA_DIR)]
        uses = uses | ({"nccl"} if "rccl" in uses else set())
    cmd += ["-I", str(INCLUDE_DIR)]
    if tk is not None:
        cmd += ["-I", str(tk), "-DKITTENS_HOPPER", "--expt-relaxed-constexpr",
                "--expt-extended-lambda"]
        # TMA descriptors are made with the driver API: the driver's own library where there
        # is one; without a driver (CI) its symbols stay unresolved in the shared object
        cuda = driver_library("libcuda.so.1")
        if cuda:
            cmd += [f"-L{cuda.parent}", f"-l:{cuda.name}"]
    if libs.nccl_include:
        cmd += ["-I", str(libs.nccl_include)]
    if libs.nvshmem_include:
        cmd += ["-I", str(libs.nvshmem_include)]
    if "nvshmem" in uses:
        cmd += ["-rdc=true"]
    cmd += ["-o", str(output), str(source)]
    if uses & {"nccl", "nccl-device"} and libs.nccl_lib:
        cmd += ["-L", str(libs.nccl_lib), "-l:libnccl.so.2", f"-Xlinker=-rpath={libs.nccl_lib}"]
    if "nvshmem" in uses and libs.nvshmem_lib:
        cmd += ["-L", str(libs.nvshmem_lib), "-l:libnvshmem_host.so.3", "-lnvshmem_device",
                f"-Xlinker=-rpath={libs.nvshmem_lib}"]
    if "nvml" in uses:
        nvml = nvml_library()
        if nvml:  # the driver's copy; without a driver (CI) the symbols stay unresolved
            cmd += [f"-L{nvml.parent}", f"-l:{nvml.name}"]
    runtime = cuda_runtime_dir()
    if runtime:
        cmd += [f"-Xlinker=-rpath={runtime}"]
    return cmd


def build_cuda(task: Task, source: str, cache_dir: Path, arch: str,
               thunderkittens: str | Path | None = None) -> Artifact:
    header = "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))
    tk = thunderkittens_include(thunderkittens) if uses_thunderkittens(task) else None
    if uses_thunderkittens(task) and tk is None:
        raise Rejected(Verdict.INFRA_ERROR, "the ThunderKittens headers are not here: set "
                       f"{THUNDERKITTENS_ENV} (or --commbench-thunderkittens) to their folder")
    if task.language == "hip":
        header += "".join(p.read_text() for p in sorted(HIP_ON_CUDA_DIR.rglob("*.h")))
    key = digest(CUDA_RECIPE_VERSION, arch, task.relpath, task.language, task.library,
                 *task.requires, header, _headers_digest(str(tk)) if tk else "", source)
    folder = cache_dir / key

    def make(src: Path, tmp: Path, work: Path) -> None:
        keep = work / "keep"
        keep.mkdir()
        _compile([*cuda_command(task, src, tmp, arch, thunderkittens), "--keep", "--keep-dir",
                  str(keep)], work)
        (folder / DEVICE_FINDINGS).write_text("\n".join(device_forbidden(keep)))

    lib = _built(folder, "solution" + (".hip" if task.language == "hip" else ".cu"), source,
                 make)
    try:
        found = (folder / DEVICE_FINDINGS).read_text().split()
    except OSError:  # a build from before the device-code check: look again
        shutil.rmtree(folder, ignore_errors=True)
        return build_cuda(task, source, cache_dir, arch, thunderkittens)
    if found:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the device code uses NVLink multicast ({', '.join(found)}), which is "
                       f"never allowed", "PTX instructions forbidden on every task: "
                       + ", ".join(DEVICE_FORBIDDEN))
    patterns = native_forbid(task_forbid(task, on_cuda=True))
    bad = forbidden_uses(linked_names(lib), patterns)
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the built solution links what this task forbids: {', '.join(bad)}",
                       f"forbidden patterns: {', '.join(patterns)}")
    return Artifact(lib, key)


def device_forbidden(keep: Path) -> list[str]:
    """The DEVICE_FORBIDDEN instructions in the PTX the compiler generated (its kept files)."""
    found = set()
    for ptx in keep.glob("*.ptx"):
        text = ptx.read_text(errors="replace")
        found.update(op for op in DEVICE_FORBIDDEN if op in text)
    return sorted(found)
