"""The HIP build recipe (toolchains.amd.build_hip) with Debian's clang-19 and ROCm device libraries:
a real gfx942 (and gfx90a) code object in the shared object, a compile error as the
solution's verdict, a forbidden symbol refused, a cached build reused. Skipped, saying so,
where the compiler is not installed (CI installs it)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from pytest_commbench.toolchains.amd import DEBIAN_DEVICE_LIBS, build_hip, rocm_path
from pytest_commbench.verdicts import Rejected, Verdict

pytestmark = pytest.mark.skipif(
    rocm_path() is None and not (shutil.which("clang++-19") and shutil.which("llvm-as-19")
                                 and DEBIAN_DEVICE_LIBS.is_dir()),
    reason="no HIP compiler here: ROCm, or Debian's clang-19 clang-tools-19 lld-19 llvm-19 "
           "libamdhip64-dev rocm-device-libs")

KERNEL = """
#include <hip/hip_runtime.h>
#include "commbench.h"
__global__ void bump(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" int solution_step(float* d, int n) {
  hipLaunchKernelGGL(bump, dim3((n + 255) / 256), dim3(256), 0, 0, d, n);
  return (int)hipDeviceSynchronize();
}
"""


def _task(forbid=()):
    return SimpleNamespace(relpath="collective/hip_probe", library="hip-runtime", requires=(),
                           forbid=tuple(forbid), language="hip")


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
def test_a_hip_solution_builds_with_a_code_object_for_the_arch(tmp_path, arch):
    art = build_hip(_task(), KERNEL, tmp_path, arch)
    data = art.path.read_bytes()
    assert data[:4] == b"\x7fELF" and f"amdgcn-amd-amdhsa--{arch}".encode() in data
    # the same source again: the cached library, not a second build
    stamp = art.path.stat().st_mtime_ns
    assert build_hip(_task(), KERNEL, tmp_path, arch).path.stat().st_mtime_ns == stamp


def test_a_compile_error_is_the_solutions_verdict_with_the_compilers_words(tmp_path):
    with pytest.raises(Rejected) as got:
        build_hip(_task(), KERNEL.replace("x[i] += 1.0f;", "x[i] += undefined_name;"),
                  tmp_path, "gfx942")
    assert got.value.verdict is Verdict.COMPILE_ERROR and "undefined_name" in got.value.detail


def test_a_run_time_lookup_is_forbidden_where_the_task_forbids_anything(tmp_path):
    source = KERNEL + """
#include <dlfcn.h>
extern "C" void* find(const char* name) { return dlsym(RTLD_DEFAULT, name); }
"""
    build_hip(_task(), source, tmp_path, "gfx942")  # nothing forbidden: it builds
    with pytest.raises(Rejected) as got:
        build_hip(_task(forbid=["ncclAllReduce"]), source, tmp_path, "gfx942")
    assert got.value.verdict is Verdict.FORBIDDEN and "dlsym" in got.value.message
