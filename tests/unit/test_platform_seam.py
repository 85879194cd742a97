"""A GPU no profile names: --platform=auto makes a profile from the devices' own properties
(never the CPU platform silently), takes the tasks written for its vendor, and lets their
`requires` and language decide; variants (h200-hip) run only the tasks that name them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_commbench.platforms import GENERIC, amd, make
from pytest_commbench.platforms import nvidia as gpu
from pytest_commbench.profiles import DISTINCT

H100 = {"name": "NVIDIA H100 80GB HBM3", "driver": "570.00", "memory": "81559 MiB"}
TOPO = "        GPU0    GPU1\nGPU0     X      NV18\nGPU1    NV18     X\n"


@pytest.fixture
def h100s(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [H100, H100])
    monkeypatch.setattr(gpu, "compute_capability", lambda: "9.0")
    monkeypatch.setattr(gpu, "nvlink_topology", lambda: TOPO)
    monkeypatch.setattr(amd, "KFD_NODES", tmp_path / "absent")
    monkeypatch.setattr(amd, "tool_gpus", lambda: [])


def _task(platforms, language="cuda", requires=()):
    return SimpleNamespace(platforms=tuple(platforms), language=language,
                           requires=tuple(requires))


def test_auto_on_a_gpu_without_a_profile_makes_one_from_its_properties(h100s):
    assert gpu.detect() == GENERIC["nvidia"]
    platform = make(GENERIC["nvidia"])
    profile = platform.profile
    assert (profile.arch, profile.gpus_per_node, profile.interconnect, profile.model) == \
        ("sm_90", 2, "nvlink", "H100 80GB HBM3")
    assert {"nccl", "nvshmem", "cuda-ipc", "nvlink", "sm_90", DISTINCT} <= profile.features
    assert platform.languages == ("cuda", "python") and platform.backend == "cuda"


def test_a_generic_profile_takes_its_vendors_tasks_and_their_requires_decide(h100s):
    platform = make(GENERIC["nvidia"])
    assert platform.accepts(_task(["h200", "b300"]))
    assert not platform.accepts(_task(["cpu"]))
    assert not platform.accepts(_task(["mi325x", "h200-hip"], language="hip"))
    # what the devices lack is the reason, not the platform's name
    reason = platform.skip_reason(_task(["h200", "b300"], requires=["nccl-device"]), 2)
    assert reason == f"platform {GENERIC['nvidia']} lacks nccl-device"


def test_variants_run_only_the_tasks_that_name_them():
    hip = make("h200-hip")
    assert hip.accepts(_task(["mi325x", "h200-hip"], language="hip"))
    assert not hip.accepts(_task(["h200", "b300"]))
    h200 = make("h200")
    assert h200.accepts(_task(["b300"])) and not h200.accepts(_task(["mi325x", "h200-hip"]))


def test_a_generic_profile_without_gpus_is_a_usage_error_not_a_cpu_run(monkeypatch):
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    with pytest.raises(ValueError, match="there are none"):
        make(GENERIC["nvidia"])


def test_an_amd_gpu_without_a_profile_gets_one_from_the_kfd_topology(tmp_path, monkeypatch):
    from test_amd_discovery import make_tree

    monkeypatch.setattr(amd, "KFD_NODES", make_tree(tmp_path / "nodes", gpus=4, device=0x74A1))
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    assert amd.detect() == GENERIC["amd"]
    profile = make(GENERIC["amd"]).profile
    assert (profile.arch, profile.gpus_per_node, profile.interconnect, profile.model) == \
        ("gfx942", 4, "xgmi", "MI300X")
    assert {"rccl", "hip-ipc", "xgmi"} <= profile.features and profile.languages == ("hip",)


def test_the_platform_option_lists_every_platform_of_the_registry(pytester):
    """`pytest --help` names every platform the registry has (h200-hip, which auto never
    picks, marked so) and the generic ones: the list is the registry's, not a copy."""
    from pytest_commbench.profiles import NAMES, PROFILES

    result = pytester.runpytest_subprocess("--help")
    text = " ".join(result.stdout.str().split())
    text = text.replace("- ", "-")  # help lines may wrap at a hyphen
    start = text.index("--platform=")
    shown = text[start:text.index("--commbench-", start)]
    for name in (*NAMES, *GENERIC.values()):
        assert name in shown, (name, shown)
    assert all(f"{n} (by name only)" in shown for n in NAMES
               if n in PROFILES and not PROFILES[n].detected)


def test_the_platform_declares_what_is_asked_of_it():
    """The engine, the session, doctor and the pre-run checks read what a platform declares:
    the CPU's answers are the base's, a GPU platform answers for its devices."""
    cpu, h200, mi325x = make("cpu"), make("h200"), make("mi325x")
    python, cuda = _task(["cpu"], "python"), _task(["h200"])
    assert (cpu.has_gpus, cpu.staged, cpu.cuda_api, cpu.profile, cpu.visible_gpus()) == \
        (False, False, False, None, None)
    assert cpu.label == "cpu" and not cpu.shared(8) and cpu.nccl_lib() is None
    assert cpu.batches(python, gpu_batch=False) and not cpu.batches(cuda, gpu_batch=True)
    with pytest.raises(ValueError, match="no GPUs"):
        cpu.place(2)
    assert (h200.has_gpus, h200.staged, h200.cuda_api, h200.label) == (True, True, True, "h200")
    assert h200.batches(cuda, gpu_batch=True) and not h200.batches(python, gpu_batch=False)
    assert not h200.shared(8)  # a GPU per rank
    h200.place(4)
    assert h200.shared(2) and h200.shared(8) and not h200.shared(1)
    assert (mi325x.has_gpus, mi325x.staged, mi325x.cuda_api) == (True, True, False)


def test_no_module_probes_the_platform_or_branches_on_a_backends_name():
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "pytest_commbench"
    probe = re.compile(r"(getattr|hasattr)\((state\.|plan\.)?platform\b|"
                       r"platform\.backend\s*(==|!=|in\b)")
    found = [f"{path.relative_to(package)}:{n}"
             for path in package.rglob("*.py") if "platforms" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert found == []
