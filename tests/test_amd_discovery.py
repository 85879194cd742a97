"""AMD GPUs from the kernel's KFD topology (platforms/amd.py), against a fake tree written as
the driver lays it out: a CPU node and eight MI325X nodes (gfx942, device 0x74a5), each linked
to the CPU over PCIe and to every other GPU over xGMI."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_commbench.platforms import amd, detect_gpu, make
from pytest_commbench.platforms import nvidia as gpu


def _node(root: Path, n: int, gpu_id: int, props: dict[str, int], links: list[dict]) -> None:
    node = root / str(n)
    (node / "io_links").mkdir(parents=True)
    (node / "gpu_id").write_text(f"{gpu_id}\n")
    (node / "properties").write_text("".join(f"{k} {v}\n" for k, v in props.items()))
    for k, link in enumerate(links):
        (node / "io_links" / str(k)).mkdir()
        (node / "io_links" / str(k) / "properties").write_text(
            "".join(f"{a} {b}\n" for a, b in link.items()))


def make_tree(root: Path, gpus: int = 8, device: int = 0x74A5, version: int = 90402) -> Path:
    _node(root, 0, 0, {"cpu_cores_count": 96, "simd_count": 0, "vendor_id": 0}, [])
    for i in range(1, gpus + 1):
        links = [{"type": 2, "node_from": i, "node_to": 0, "weight": 20}]
        links += [{"type": 11, "node_from": i, "node_to": j, "weight": 15,
                   "min_bandwidth": 50000, "max_bandwidth": 64000}
                  for j in range(1, gpus + 1) if j != i]
        _node(root, i, 1000 + i, {"cpu_cores_count": 0, "simd_count": 1216,
                                  "gfx_target_version": version, "vendor_id": 0x1002,
                                  "device_id": device, "location_id": 256 * i}, links)
    return root


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    root = make_tree(tmp_path / "nodes")
    monkeypatch.setattr(amd, "KFD_NODES", root)
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.mark.parametrize("version, name", [(90402, "gfx942"), (90010, "gfx90a"),
                                           (90400, "gfx940"), (110000, "gfx1100")])
def test_the_gfx_name_of_a_target_version(version, name):
    assert amd.gfx_name(version) == name


def test_the_gpus_of_the_topology_and_how_they_are_linked(tree):
    gpus = amd.kfd_gpus()
    assert [g.node for g in gpus] == list(range(1, 9))  # the CPU node is not a GPU
    assert {(g.gfx, g.model) for g in gpus} == {("gfx942", "MI325X")}
    matrix = amd.link_matrix(gpus)
    assert all(matrix[i][i] == "X" for i in range(8))
    assert all(matrix[i][j] == "XGMI" for i in range(8) for j in range(8) if i != j)


def test_visible_devices_narrow_what_a_process_sees(tree):
    gpus = amd.kfd_gpus()
    assert len(amd.visible(gpus, {})) == 8
    assert [g.node for g in amd.visible(gpus, {"HIP_VISIBLE_DEVICES": "2,5"})] == [3, 6]
    # HIP's list indexes what the runtime's left
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6", "HIP_VISIBLE_DEVICES": "1"}
    assert [g.node for g in amd.visible(gpus, env)] == [6]
    # the runtimes stop at the first entry they cannot use
    assert [g.node for g in amd.visible(gpus, {"HIP_VISIBLE_DEVICES": "0,9,1"})] == [1]


def test_auto_finds_the_mi325x_and_the_platform_counts_its_gpus(tree, monkeypatch):
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    assert detect_gpu() == "mi325x"
    platform = make("mi325x")
    assert platform.visible_gpus() == 8
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    assert platform.visible_gpus() == 2
    fp = platform.fingerprint()
    assert fp["gpu"] == "AMD MI325X" and fp["gpu_count"] == 2 and fp["gfx"] == "gfx942"
    assert fp["gpu0_gpu1_link"] == "XGMI"


def test_another_amd_gpu_is_not_taken_for_an_mi325x(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "nodes", gpus=2, device=0x74A1)  # MI300X: no profile of its own
    monkeypatch.setattr(amd, "KFD_NODES", root)
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    assert {g.model for g in amd.kfd_gpus()} == {"MI300X"}
    assert detect_gpu() == amd.GENERIC["amd"]  # a profile of its own properties, not mi325x
    assert make("mi325x").visible_gpus() == 0
    from pytest_commbench.preflight import _visibility_hint

    assert "the KFD topology has MI300X" in _visibility_hint("amd")


def test_no_kfd_tree_is_no_amd_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(amd, "KFD_NODES", tmp_path / "absent")
    assert amd.kfd_gpus() == []
    from pytest_commbench.preflight import _visibility_hint

    assert "no AMD GPU in the kernel's KFD topology" in _visibility_hint("amd")


ROCMINFO = """ROCk module is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.14
==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 9654 96-Core Processor
  Marketing Name:          AMD EPYC 9654 96-Core Processor
  Vendor Name:             CPU
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx942
  Uuid:                    GPU-4c1a2b3d4e5f6071
  Marketing Name:          AMD Instinct MI325X
  Vendor Name:             AMD
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
*******
Agent 3
*******
  Name:                    gfx942
  Marketing Name:          AMD Instinct MI325X
  Vendor Name:             AMD
  Device Type:             GPU
*** Done ***
"""
ROCM_SMI_TOPO = """

============================ ROCm System Management Interface ============================
================================ Weight between two GPUs =================================
       GPU0         GPU1
GPU0   0            15
GPU1   15           0

================================= Hops between two GPUs ==================================
       GPU0         GPU1
GPU0   0            1
GPU1   1            0

=============================== Link Type between two GPUs ===============================
       GPU0         GPU1
GPU0   0            XGMI
GPU1   XGMI         0

======================================= Numa Nodes =======================================
GPU[0]          : (Topology) Numa Node: 0
GPU[0]          : (Topology) Numa Affinity: 0
GPU[1]          : (Topology) Numa Node: 0
GPU[1]          : (Topology) Numa Affinity: 0
================================== End of ROCm SMI Log ===================================
"""


def _fake_tools(folder: Path, monkeypatch, rocminfo: str, topo: str) -> None:
    folder.mkdir()
    for name, text in (("rocminfo", rocminfo), ("rocm-smi", topo)):
        (folder / f"{name}.out").write_text(text)
        script = folder / name
        script.write_text(f"#!/bin/sh\ncat '{folder / (name + '.out')}'\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")


def test_without_a_kfd_tree_rocminfo_and_rocm_smi_say_what_is_there(tmp_path, monkeypatch):
    """A container without /sys/class/kfd: the GPU agents of rocminfo (not its CPU, not the
    ISA lines' nested names) and the link types of rocm-smi --showtopo, as the same matrix."""
    monkeypatch.setattr(amd, "KFD_NODES", tmp_path / "absent")
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    _fake_tools(tmp_path / "bin", monkeypatch, ROCMINFO, ROCM_SMI_TOPO)
    found = amd.gpus()
    assert [(g.gfx, g.model) for g in found] == [("gfx942", "MI325X")] * 2
    assert amd.link_matrix(found) == [["X", "XGMI"], ["XGMI", "X"]]
    assert detect_gpu() == "mi325x"
    assert make("mi325x").visible_gpus() == 2


def test_the_tools_parsers_on_their_own():
    assert amd.parse_rocminfo(ROCMINFO) == [("gfx942", "AMD Instinct MI325X")] * 2
    assert amd.parse_rocm_smi_links(ROCM_SMI_TOPO) == [["X", "XGMI"], ["XGMI", "X"]]
    pcie = ROCM_SMI_TOPO.replace("XGMI", "PCIE")
    assert amd.parse_rocm_smi_links(pcie) == [["X", "PCIE"], ["PCIE", "X"]]
    assert amd.parse_rocminfo("") == [] and amd.parse_rocm_smi_links("") == []


def test_no_tools_and_no_kfd_tree_is_no_amd_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(amd, "KFD_NODES", tmp_path / "absent")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert amd.gpus() == []
