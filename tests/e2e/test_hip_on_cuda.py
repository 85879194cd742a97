"""HIP tasks on an NVIDIA GPU (platform h200-hip): the project's HIP->CUDA header lets nvcc
build a HIP solution, its HIP names become CUDA's (so a task's `hipMemcpy*` forbids the
`cudaMemcpy*` the build links), the platform builds only HIP and is never what
`--platform=auto` picks; and RCCL tasks build for gfx942 where RCCL's headers are missing."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from pytest_commbench.build import hip_on_cuda_forbid
from pytest_commbench.platforms import make
from pytest_commbench.profiles import PROFILES
from pytest_commbench.toolchains.amd import DEBIAN_DEVICE_LIBS, build_hip, rocm_path
from pytest_commbench.toolchains.nvidia import build_cuda
from pytest_commbench.verdicts import Rejected, Verdict

SOURCE = """
#include <hip/hip_runtime.h>
#include "commbench.h"
__global__ void handshake(float* x, unsigned* flag, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] += __shfl_xor(x[i], 1);
  if (i == 0) {
    __hip_atomic_store(flag, 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
    while (__hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM) == 0u)
      __builtin_amdgcn_s_sleep(1);
  }
}
extern "C" int commbench_run(const commbench_ctx* ctx) {
  hipStream_t s = (hipStream_t)ctx->stream;
  size_t n = ctx->buffer_bytes[0] / sizeof(float);
  hipLaunchKernelGGL(handshake, dim3((n + 255) / 256), dim3(256), 0, s,
                     (float*)ctx->buffers[0], (unsigned*)ctx->workspace, n);
  COPY
  return hipGetLastError() == hipSuccess ? 0 : 1;
}
"""
COPY = "hipMemcpyAsync(ctx->buffers[1], ctx->buffers[0], ctx->buffer_bytes[0], " \
       "hipMemcpyDeviceToDevice, s);"
RCCL = """
#include <hip/hip_runtime.h>
#include <rccl/rccl.h>
#include "commbench.h"
extern "C" int commbench_run(const commbench_ctx* ctx) {
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  size_t n = ctx->buffer_bytes[0] / sizeof(float);
  return ncclAllReduce(ctx->buffers[0], ctx->buffers[1], n, ncclFloat32, ncclSum, comm,
                       (hipStream_t)ctx->stream) == ncclSuccess ? 0 : 1;
}
"""


def _task(forbid=(), library="hip-runtime", requires=("hip-ipc",)):
    return SimpleNamespace(relpath="collective/hip_probe", library=library,
                           requires=tuple(requires), forbid=tuple(forbid), language="hip")


def test_hip_names_in_forbid_patterns_also_forbid_the_cuda_names_they_become():
    assert hip_on_cuda_forbid(("hipMemcpy*", "rccl*", "librccl*", "dlopen")) == (
        "hipMemcpy*", "rccl*", "librccl*", "dlopen", "cudaMemcpy*", "nccl*", "libnccl*")


def test_h200_hip_builds_only_hip_and_is_never_detected():
    hip, h200 = make("h200-hip"), make("h200")
    assert hip.languages == ("hip",) and hip.backend == "cuda" and hip.vendor == "nvidia"
    assert "hip" not in h200.languages
    assert not PROFILES["h200-hip"].detected and PROFILES["h200"].detected
    task = SimpleNamespace(platforms=("h200", "h200-hip"), language="cuda", requires=())
    assert "does not build cuda" in hip.skip_reason(task, 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_a_hip_solution_builds_through_the_header_and_its_forbidden_copy_is_caught(tmp_path):
    source = SOURCE.replace("COPY", "")
    art = build_cuda(_task(forbid=["hipMemcpy*"]), source, tmp_path, "sm_90")
    assert art.path.read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(Rejected) as got:  # the HIP copy links as cudaMemcpyAsync
        build_cuda(_task(forbid=["hipMemcpy*"]), SOURCE.replace("COPY", COPY), tmp_path,
                   "sm_90")
    assert got.value.verdict is Verdict.FORBIDDEN and "cudaMemcpyAsync" in got.value.message
    # a HIP name the header does not map is the solution's compile error
    with pytest.raises(Rejected) as got:
        build_cuda(_task(), source.replace("hipGetLastError()", "hipExtGetLinkTypeAndHopCount()"),
                   tmp_path, "sm_90")
    assert got.value.verdict is Verdict.COMPILE_ERROR


@pytest.mark.skipif(rocm_path() is None and not (shutil.which("clang++-19")
                                                 and DEBIAN_DEVICE_LIBS.is_dir()),
                    reason="no HIP compiler here (ROCm, or Debian's clang-19 and ROCm packages)")
def test_an_rccl_solution_builds_for_gfx942_without_rccl_installed(tmp_path):
    art = build_hip(_task(library="rccl", requires=("rccl",)), RCCL, tmp_path, "gfx942")
    assert art.path.read_bytes()[:4] == b"\x7fELF"  # host code only: no code object needed
    with_kernel = SOURCE.replace("COPY", "") + RCCL.replace("commbench_run", "rccl_step")
    art = build_hip(_task(library="rccl", requires=("rccl",)), with_kernel, tmp_path, "gfx942")
    assert b"amdgcn-amd-amdhsa--gfx942" in art.path.read_bytes()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_an_rccl_solution_builds_on_nccl_through_the_header(tmp_path):
    from pytest_commbench.toolchains.nvidia import find_cuda_libs

    if find_cuda_libs().nccl_include is None:
        pytest.skip("no NCCL headers here (pip install -e '.[cuda-headers]')")
    art = build_cuda(_task(library="rccl", requires=("rccl",)), RCCL, tmp_path, "sm_90")
    assert art.path.read_bytes()[:4] == b"\x7fELF"


HIP_TASK = "p2p/flag_pingpong_hip"


def _broken_answer(root) -> None:
    """A full-file answer to HIP_TASK whose first editable region names what does not exist."""
    from conftest import REPO

    text = (REPO / "references" / HIP_TASK / "solution.hip").read_text()
    marker = next(line for line in text.splitlines() if ">>> COMMBENCH EDIT" in line)
    folder = root / "answers" / HIP_TASK
    folder.mkdir(parents=True)
    (folder / "solution.hip").write_text(
        text.replace(marker, marker + "\nstatic int broken = no_such_name_here;", 1))


@pytest.mark.skipif(rocm_path() is None and not (shutil.which("clang++-19")
                                                 and DEBIAN_DEVICE_LIBS.is_dir()),
                    reason="no HIP compiler here (ROCm, or Debian's clang-19 and ROCm packages)")
def test_compile_only_builds_answers_for_gfx942_on_a_machine_without_amd_gpus(bench):
    """--platform=mi325x --commbench-compile-only: the reference builds (a pass marked
    compile-only, nothing run), an answer that does not compile is a compile_error; without
    --commbench-compile-only the platform is refused in one line, naming the option."""
    bench.add_task(HIP_TASK, ranks=2)
    result = bench.run("--platform=mi325x", "--commbench-compile-only")
    result.assert_outcomes(passed=1)
    record = bench.records()[-1]
    assert record["compile_only"] is True and record["verdict"] == "pass"
    assert record["message"] == "built for mi325x (compile only: not run)"
    assert record.get("speedup") is None
    result.stdout.fnmatch_lines(["compile only (--commbench-compile-only): 1 of 1 answers built, "
                                 "none ran; they are not counted in the scores below",
                                 "Pass Rate - (0/0)*(1 not applicable)"])
    _broken_answer(bench.root)
    result = bench.run("--platform=mi325x", "--commbench-compile-only",
                       f"--commbench-model=dir:{bench.root / 'answers'}")
    result.assert_outcomes(failed=1)
    assert bench.records()[-1]["verdict"] == "compile_error"
    assert bench.records()[-1]["compile_only"] is True  # its failure is not scored either
    refused = bench.run("--platform=mi325x")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*platform mi325x needs MI325X GPUs, and none is visible*"
                                  "--commbench-compile-only builds for it without running*"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")
def test_compile_only_builds_the_hip_tasks_through_the_header_for_h200_hip(bench):
    bench.add_task(HIP_TASK, ranks=2)
    result = bench.run("--platform=h200-hip", "--commbench-compile-only")
    result.assert_outcomes(passed=1)
    assert bench.records()[-1]["message"] == "built for h200-hip (compile only: not run)"


ATOMICS = r"""
#include <hip/hip_runtime.h>
#include "commbench.h"
__global__ void k(unsigned* flags, unsigned long long* wide) {
  __hip_atomic_fetch_or(flags, 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_fetch_and(flags + 1, 6u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  __hip_atomic_fetch_xor(flags + 2, 3u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_fetch_max(wide, 9ull, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_fetch_min(wide + 1, 2ull, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  __hip_atomic_fetch_sub(flags + 3, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
  unsigned want = 0;
  __hip_atomic_compare_exchange_weak(flags + 4, &want, 1u, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED,
                                     __HIP_MEMORY_SCOPE_SYSTEM);
}
extern "C" int commbench_run(const commbench_ctx* ctx) {
  hipPointerAttribute_t attr;
  if (hipPointerGetAttributes(&attr, ctx->buffers[0]) != hipSuccess) return 1;
  if (attr.type != hipMemoryTypeDevice || attr.device != ctx->device) return 2;
  hipLaunchKernelGGL(k, dim3(1), dim3(1), 0, (hipStream_t)ctx->stream,
                     (unsigned*)ctx->workspace, (unsigned long long*)ctx->buffers[0]);
  return hipGetLastError() == hipSuccess ? 0 : 3;
}
"""


def test_the_header_maps_every_scoped_atomic_and_the_pointer_attributes(tmp_path):
    """The HIP tasks' prompts allow every `__hip_atomic_*` builtin and the memory API: each
    read-modify-write clang's HIP has, compare-exchange weak and strong, and the pointer
    attributes build through the header (a one-shot answer used fetch_or and was rejected
    for a name the header lacked)."""
    art = build_cuda(_task(), ATOMICS, tmp_path, "sm_90")
    assert art.path.read_bytes()[:4] == b"\x7fELF"
