"""Native (CUDA) builds: a function looked up at run time is forbidden wherever the task
forbids anything (needs nvcc, not a GPU)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_commbench.build import native_forbid
from pytest_commbench.tasks import load_task
from pytest_commbench.toolchains.nvidia import build_cuda
from pytest_commbench.verdicts import Rejected, Verdict

REPO = Path(__file__).resolve().parents[2]
CHEAT = REPO / "fixtures" / "cheats-gpu" / "lookup_through_dlvsym" / "p2p" / "ce_peer_copy"


def test_run_time_lookups_join_a_non_empty_forbid_list():
    assert "dlvsym" in native_forbid(("nccl*",))
    assert "cudaGetDriverEntryPoint*" in native_forbid(("nccl*",))
    assert {"commbench_guard_*", "cupti*", "libcupti*"} <= set(native_forbid(()))
    assert "MPI_Comm_spawn*" in native_forbid(())
    assert "cuMulticast*" in native_forbid(())  # NVLink multicast: never, whatever the task


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_lookup_under_another_name_is_forbidden_at_build(tmp_path):
    task = load_task(REPO / "suites" / "p2p" / "ce_peer_copy" / "task.toml", REPO / "suites")
    with pytest.raises(Rejected) as info:
        build_cuda(task, (CHEAT / "solution.cu").read_text(), tmp_path, "sm_90")
    assert info.value.verdict is Verdict.FORBIDDEN
    assert "dlvsym" in info.value.message


GPU_CHEATS = REPO / "fixtures" / "cheats-gpu"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cheat", sorted(p.name for p in GPU_CHEATS.iterdir() if p.is_dir()))
def test_every_gpu_cheat_builds_unless_it_is_forbidden_at_build(tmp_path, cheat):
    """The CUDA cheats run on the GPU machine only; here each must at least compile (a cheat
    that does not build proves nothing there), or be refused at build when that is its
    expected verdict."""
    import tomllib

    spec = tomllib.loads((GPU_CHEATS / cheat / "cheat.toml").read_text())
    task = load_task(REPO / "suites" / spec["task"] / "task.toml", REPO / "suites")
    (source,) = (GPU_CHEATS / cheat / spec["task"]).glob("solution.*")
    try:
        build_cuda(task, source.read_text(), tmp_path, "sm_90")
    except Rejected as exc:
        if exc.verdict is Verdict.COMPILE_ERROR and re.search(
                r"(nccl|nvshmem)\w*\.h.*(No such file|cannot open)", exc.detail):
            pytest.skip(f"the {task.library} headers are not installed (the cuda-headers extra)")
        assert exc.verdict is Verdict.FORBIDDEN and "forbidden" in spec["expect"], (
            exc.verdict, exc.message, exc.detail[-2000:])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_multicast_in_the_generated_device_code_is_forbidden_on_every_build(tmp_path):
    """NVLink multicast found in the PTX, however the source spells it, on a fresh build and
    on a build taken from the cache."""
    cheat = GPU_CHEATS / "multimem_spelled_apart" / "collective" / "oneshot_allreduce_ipc"
    task = load_task(REPO / "suites" / "collective" / "oneshot_allreduce_ipc" / "task.toml",
                     REPO / "suites")
    source = (cheat / "solution.cu").read_text()
    assert "multimem" not in source
    for _ in range(2):
        with pytest.raises(Rejected) as info:
            build_cuda(task, source, tmp_path, "sm_90")
        assert info.value.verdict is Verdict.FORBIDDEN and "multicast" in info.value.message


@pytest.mark.parametrize("cheat", sorted(p.name for p in GPU_CHEATS.iterdir() if p.is_dir()))
def test_every_gpu_cheat_keeps_to_its_tasks_template(cheat):
    """A cheat is judged for its trick, not for text outside the editable regions: when a
    template changes, its cheats must follow (else they would only ever be 'tampered')."""
    import tomllib

    from pytest_commbench import regions

    spec = tomllib.loads((GPU_CHEATS / cheat / "cheat.toml").read_text())
    (source,) = (GPU_CHEATS / cheat / spec["task"]).glob("solution.*")
    template = next((REPO / "suites" / spec["task"]).glob("template.*"))
    regions.verify(template.read_text(), source.read_text())
