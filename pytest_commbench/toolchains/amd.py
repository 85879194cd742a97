"""AMD's toolchain: a HIP solution built into a shared object with a code object for the
profile's gfx by the harness's recipe. Where ROCm is installed its compiler builds (ROCM_PATH,
else /opt/rocm); elsewhere Debian's clang-19 with Debian's ROCm 5.2 device libraries, whose ISA
bitcode stops at gfx940: the missing `oclc_isa_version_<arch>.bc` is assembled (one constant,
the ISA version) beside links to the others, once per build cache. The symbols the library
links are checked against the task's `forbid` patterns, as `build` checks every native build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..build import (
    INCLUDE_DIR,
    Artifact,
    _built,
    _compile,
    digest,
    forbidden_uses,
    linked_names,
    native_forbid,
    task_forbid,
)
from ..tasks import Task
from ..verdicts import Rejected, Verdict

HIP_RECIPE_VERSION = "hip-1"
DEBIAN_DEVICE_LIBS = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
# For builds on a machine without RCCL's headers: declarations of the part of RCCL's API
# the tasks use (the library itself is then resolved where the task runs)
RCCL_DECLARATIONS_DIR = INCLUDE_DIR / "rccl_declarations"


def rocm_path() -> Path | None:
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root and (Path(root) / "bin" / "amdclang++").exists():
            return Path(root)
    return None


def isa_version(arch: str) -> int:
    """gfx942 -> 9402, gfx90a -> 9010: major * 1000 + minor * 100 + stepping (hex digits)."""
    digits = arch[3:]
    return int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)


def hip_device_libs(arch: str, cache_dir: Path) -> Path:
    """A folder of Debian's device-library bitcode with the ISA file of `arch` (assembled with
    llvm-as-19 where Debian lacks it)."""
    folder = Path(cache_dir) / f"hip-device-libs-{arch}"
    isa = folder / f"oclc_isa_version_{arch[3:]}.bc"
    if isa.exists():
        return folder
    if not DEBIAN_DEVICE_LIBS.is_dir():
        raise Rejected(Verdict.INFRA_ERROR, "no HIP device libraries: install ROCm, or Debian's "
                       "rocm-device-libs with clang-19, clang-tools-19, lld-19, llvm-19 and "
                       "libamdhip64-dev")
    work = Path(tempfile.mkdtemp(prefix=".libs-", dir=cache_dir))
    try:
        for bc in DEBIAN_DEVICE_LIBS.glob("*.bc"):
            (work / bc.name).symlink_to(bc)
        if not (work / isa.name).exists():
            layout = subprocess.run(
                ["clang-19", "-target", "amdgcn-amd-amdhsa", "-nogpulib", "-x", "c", "-S",
                 "-emit-llvm", "-o", "-", "/dev/null"], capture_output=True, text=True,
                timeout=60).stdout
            line = next((x for x in layout.splitlines() if x.startswith("target datalayout")), "")
            (work / "isa.ll").write_text(
                f'{line}\ntarget triple = "amdgcn-amd-amdhsa"\n'
                f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) "
                f"constant i32 {isa_version(arch)}, align 4\n")
            _compile(["llvm-as-19", "isa.ll", "-o", isa.name], work)
            (work / "isa.ll").unlink()
        try:
            work.rename(folder)
        except OSError:  # another build put it in place first
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def hip_command(task: Task, source: Path, output: Path, arch: str, cache_dir: Path) -> list[str]:
    rocm = rocm_path()
    if rocm is not None:
        cmd = [str(rocm / "bin" / "amdclang++"), "-x", "hip", f"--offload-arch={arch}",
               f"--rocm-path={rocm}"]
    else:
        cmd = ["clang++-19", "-x", "hip", f"--offload-arch={arch}", "--rocm-path=/usr",
               f"--rocm-device-lib-path={hip_device_libs(arch, cache_dir)}"]
    cmd += ["-O3", "-std=c++17", "-fPIC", "-shared", "-I", str(INCLUDE_DIR)]
    if "rccl" in {task.library, *task.requires}:
        found = rccl_library(rocm)
        if found is None:  # build here, resolve RCCL where the task runs
            cmd += ["-I", str(RCCL_DECLARATIONS_DIR)]
        cmd += ["-o", str(output), str(source), "-lamdhip64"]
        if found is not None:
            cmd += [f"-L{found.parent}", "-lrccl", f"-Wl,-rpath,{found.parent}"]
        return cmd
    return [*cmd, "-o", str(output), str(source), "-lamdhip64"]


def rccl_library(rocm: Path | None) -> Path | None:
    """RCCL's library where its headers are installed too (ROCm's, else a distribution's)."""
    for root in ([rocm] if rocm else []) + [Path("/usr")]:
        if not (root / "include" / "rccl" / "rccl.h").exists():
            continue
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if (root / lib / "librccl.so").exists():
                return root / lib / "librccl.so"
    return None


def build_hip(task: Task, source: str, cache_dir: Path, arch: str) -> Artifact:
    """A HIP solution as a shared object with a code object for `arch` (the harness's recipe);
    cached by everything that goes into it, forbidden symbols checked as for CUDA."""
    header = "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))
    key = digest(HIP_RECIPE_VERSION, arch, "rocm" if rocm_path() else "debian", task.relpath,
                 task.library, *task.requires, header, source)
    def make(src: Path, tmp: Path, work: Path) -> None:
        _compile(hip_command(task, src, tmp, arch, Path(cache_dir)), work)
        data = tmp.read_bytes()  # (a solution of host code only, as an RCCL call, has none)
        if b"amdgcn-amd-amdhsa--" in data and f"amdgcn-amd-amdhsa--{arch}".encode() not in data:
            raise Rejected(Verdict.INFRA_ERROR, f"the build has no {arch} code object")

    lib = _built(Path(cache_dir) / key, "solution.hip", source, make)
    bad = forbidden_uses(linked_names(lib), native_forbid(task_forbid(task, on_cuda=False)))
    if bad:
        raise Rejected(Verdict.FORBIDDEN,
                       f"the built solution links what this task forbids: {', '.join(bad)}")
    return Artifact(lib, key)
