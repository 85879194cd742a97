"""The ranks' device backend by vendor: which runtime cupy must be built for, where NCCL's API
comes from, what ranks sharing a GPU get. Driven without a GPU (a stand-in cupy module whose
runtime says what it was built for), so the choices are checked on every machine; what they
do on a device is the GPU runs' (BENCHMARKS.md)."""

from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest

from pytest_commbench.platforms.amd import AmdPlatform
from pytest_commbench.platforms.cpu import CpuPlatform
from pytest_commbench.platforms.nvidia import NvidiaPlatform
from pytest_commbench.rank import gpu
from pytest_commbench.rank.backends import HostBackend, make_backend
from pytest_commbench.rank.protocol import DEVICE_VENDORS


def fake_cupy(monkeypatch, is_hip: bool | None) -> None:
    """A cupy whose runtime is HIP's (True), CUDA's (False), or a build that predates the
    `is_hip` flag (None: CUDA)."""
    runtime = SimpleNamespace() if is_hip is None else SimpleNamespace(is_hip=is_hip)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))


def test_every_backend_a_platform_names_is_one_the_ranks_have():
    for platform in (NvidiaPlatform, AmdPlatform):
        assert platform.backend in DEVICE_VENDORS, platform
    assert CpuPlatform.backend == "cpu"
    assert isinstance(make_backend("cpu"), HostBackend) and not make_backend("cpu").device


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="no rank backend 'metal'.*cuda, hip"):
        make_backend("metal")


@pytest.mark.parametrize("backend,is_hip", [("cuda", False), ("cuda", None), ("hip", True)])
def test_a_backend_takes_the_cupy_built_for_its_runtime(monkeypatch, backend, is_hip):
    fake_cupy(monkeypatch, is_hip)
    made = make_backend(backend)
    assert made.device and made.staged and made.name == backend
    assert made.vendor is DEVICE_VENDORS[backend]


@pytest.mark.parametrize("backend,is_hip,needs", [
    ("hip", False, "needs cupy built for HIP.*built for CUDA.*cupy-rocm"),
    ("hip", None, "needs cupy built for HIP"),
    ("cuda", True, "needs cupy built for CUDA.*built for HIP"),
])
def test_a_cupy_of_the_other_runtime_is_a_clear_error(monkeypatch, backend, is_hip, needs):
    """A rank on an AMD machine with cupy's CUDA build (or the other way round) stops before
    any buffer exists, saying which build it needs."""
    fake_cupy(monkeypatch, is_hip)
    with pytest.raises(RuntimeError, match=needs):
        make_backend(backend)


@pytest.mark.parametrize("backend,mps", [("cuda", "50"), ("hip", None)])
def test_ranks_sharing_a_gpu_are_mps_clients_only_on_nvidia(monkeypatch, backend, mps):
    """Both vendors' collectives need a host id per rank to put two ranks on one GPU; only
    NVIDIA has MPS and its SM shares."""
    for name in ("NCCL_HOSTID", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        monkeypatch.delenv(name, raising=False)
    gpu.share_gpu(SimpleNamespace(ranks_per_gpu=2), rank=1, size=2, local=1,
                  vendor=DEVICE_VENDORS[backend])
    assert os.environ["NCCL_HOSTID"].endswith("-rank1")
    assert os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == mps


@pytest.mark.parametrize("backend,soname", [("cuda", "libnccl.so.2"), ("hip", "librccl.so.1")])
def test_the_communicator_comes_from_the_vendors_library(monkeypatch, backend, soname):
    opened = []
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda path, mode=0: opened.append(path))
    gpu.nccl_library("/opt/lib", DEVICE_VENDORS[backend].collectives)
    gpu.nccl_library(None, DEVICE_VENDORS[backend].collectives)
    assert opened == [f"/opt/lib/{soname}", soname]


@pytest.mark.parametrize("rocm_cupy,shared,reason", [
    (False, False, "needs cupy's ROCm build .*cupy-rocm.*--commbench-compile-only builds each "
                   "answer for gfx942"),
    (True, True, "ranks sharing an AMD GPU were never tried.*--commbench-ranks-per-gpu=1"),
    (True, False, None),
])
def test_an_amd_platform_runs_ranks_only_where_their_backend_can(monkeypatch, rocm_cupy, shared,
                                                                 reason):
    """The HIP backend runs on cupy's ROCm build: without it an AMD item is skipped saying so
    (compile-only still builds); ranks sharing an AMD GPU are refused, never tried."""
    from pytest_commbench.platforms import amd, make

    platform = make("mi325x")
    monkeypatch.setattr(amd, "rocm_path", lambda: amd.Path("/opt/rocm"))
    monkeypatch.setattr(amd, "cupy_for_rocm", lambda: rocm_cupy)
    monkeypatch.setattr(platform, "shared", lambda world: shared)
    task = SimpleNamespace(language="hip", library="hip-runtime", requires=())
    found = platform.tool_reason(task, 2)
    assert (found is None) if reason is None else re.search(reason, found), found
    platform.compile_only = True
    assert platform.tool_reason(task, 2) is None
