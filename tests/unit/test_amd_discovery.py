"""AMD GPUs from the kernel's KFD topology (platforms/amd.py), against a fake tree written as
the driver lays it out: a CPU node and eight MI325X nodes (gfx942, device 0x74a5), each linked
to the CPU over PCIe and to every other GPU over xGMI; without the tree, against fake ROCm tools
on PATH (amd-smi first, then rocminfo and rocm-smi)."""

from __future__ import annotations

import json
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
    folder.mkdir(exist_ok=True)
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


# amd-smi's JSON as its CLI source prints it (ROCm/amdsmi's amdsmi_cli; no real machine's
# output): `static --asic --json` and `topology --link-type --json` of an MI325X node
BDFS = ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
        "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"]


def _asic(gpu: int, device: str = "0x74a5", market: str = "AMD Instinct MI325X",
          gfx: str | None = "gfx942") -> dict:
    """The "asic" object of amd-smi static (the keys of the October 2024 source; gfx=None: a
    release before 6.3, which has no target_graphics_version)."""
    asic = {"market_name": market, "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]", "subvendor_id": "0x1002",
            "device_id": device, "subsystem_id": "0x74a5", "rev_id": "0x00",
            "asic_serial": f"0x{0x5B3C0000F0A1 + gpu:016X}", "oam_id": gpu,
            "num_compute_units": 304}
    if gfx is not None:
        asic["target_graphics_version"] = gfx
    return asic


def static_json(n: int = 8, **asic) -> str:
    """6.1 to 6.3: a list of {"gpu": N, "asic": {...}}."""
    return json.dumps([{"gpu": i, "asic": _asic(i, **asic)} for i in range(n)], indent=4)


def topology_json(kind: str = "XGMI", n: int = 8) -> str:
    """6.1.1 and later: per source GPU, "links" to every GPU (itself SELF)."""
    return json.dumps([{"gpu": i, "bdf": BDFS[i],
                        "links": [{"gpu": j, "bdf": BDFS[j],
                                   "link_type": "SELF" if i == j else kind} for j in range(n)]}
                       for i in range(n)], indent=4)


def topology_json_60(kind: str = "XGMI", n: int = 8) -> str:
    """5.7 to 6.1.0: per source GPU, "link_type": {"gpu_M": ...}."""
    return json.dumps([{"gpu": i, "link_type": {f"gpu_{j}": "SELF" if i == j else kind
                                                for j in range(n)}} for i in range(n)], indent=4)


def _fake_amd_smi(folder: Path, monkeypatch, static: str, topo: str, rc: int = 0) -> Path:
    """A fake amd-smi on PATH answering `static ...` and `topology ...` with these texts and
    exiting with `rc`; each call's arguments go to the returned file."""
    folder.mkdir(exist_ok=True)
    (folder / "amd-smi.static").write_text(static)
    (folder / "amd-smi.topology").write_text(topo)
    calls = folder / "amd-smi.calls"
    script = folder / "amd-smi"
    script.write_text(f"""#!/bin/sh
echo "$*" >> '{calls}'
case "$1" in
  static) cat '{folder / "amd-smi.static"}' ;;
  topology) cat '{folder / "amd-smi.topology"}' ;;
  *) exit 2 ;;
esac
exit {rc}
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    return calls


@pytest.fixture
def no_kfd(tmp_path, monkeypatch):
    monkeypatch.setattr(amd, "KFD_NODES", tmp_path / "absent")
    monkeypatch.setattr(gpu, "nvidia_gpus", lambda: [])
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_kfd_tree_amd_smi_is_asked_first(tmp_path, monkeypatch, no_kfd):
    """amd-smi's eight MI325X, all linked over xGMI, and not rocminfo's two GPUs."""
    folder = tmp_path / "bin"
    _fake_tools(folder, monkeypatch, ROCMINFO, ROCM_SMI_TOPO)
    calls = _fake_amd_smi(folder, monkeypatch, static_json(), topology_json())
    found = amd.gpus()
    assert [(g.gfx, g.model, g.device_id) for g in found] == [("gfx942", "MI325X", 0x74A5)] * 8
    matrix = amd.link_matrix(found)
    assert all(matrix[i][i] == "X" for i in range(8))
    assert all(matrix[i][j] == "XGMI" for i in range(8) for j in range(8) if i != j)
    assert calls.read_text().splitlines()[:2] == ["static --asic --json",
                                                  "topology --link-type --json"]
    assert detect_gpu() == "mi325x"
    platform = make("mi325x")
    assert platform.visible_gpus() == 8
    fp = platform.fingerprint()
    assert fp["gpu"] == "AMD MI325X" and fp["gfx"] == "gfx942"
    assert fp["gpu0_gpu1_link"] == "XGMI"


def test_a_pcie_pair_from_amd_smi(tmp_path, monkeypatch, no_kfd):
    """Two MI300X (no profile of their own) on PCIe: the generic profile has no xGMI."""
    _fake_amd_smi(tmp_path / "bin", monkeypatch,
                  static_json(2, device="0x74a1", market="AMD Instinct MI300X"),
                  topology_json("PCIE", 2))
    found = amd.gpus()
    assert [(g.gfx, g.model) for g in found] == [("gfx942", "MI300X")] * 2
    assert amd.link_matrix(found) == [["X", "PCIE"], ["PCIE", "X"]]
    assert detect_gpu() == amd.GENERIC["amd"]
    profile = amd.generic_profile()
    assert profile.interconnect == "pcie" and "xgmi" not in profile.features
    assert profile.arch == "gfx942" and profile.gpus_per_node == 2


@pytest.mark.parametrize("static, rc", [
    ("Traceback (most recent call last):\n  ...\nAmdSmiLibraryException\n", 0),  # garbage
    (static_json(), 1),  # good JSON, but the program failed
    ("", 0),
    ("[]", 0),
    ('{"error": "Unable to detect any GPU devices"}', 0),
    (json.dumps([{"gpu": 0, "bus": {"bdf": BDFS[0]}}]), 0),  # no asic
], ids=["garbage", "exit-1", "empty", "no-gpus", "an-error-object", "no-asic"])
def test_amd_smi_not_understood_falls_back_to_rocminfo_and_rocm_smi(tmp_path, monkeypatch,
                                                                     no_kfd, static, rc):
    folder = tmp_path / "bin"
    _fake_tools(folder, monkeypatch, ROCMINFO, ROCM_SMI_TOPO)
    _fake_amd_smi(folder, monkeypatch, static, topology_json(), rc)
    found = amd.gpus()
    assert [(g.gfx, g.model) for g in found] == [("gfx942", "MI325X")] * 2  # rocminfo's two
    assert amd.link_matrix(found) == [["X", "XGMI"], ["XGMI", "X"]]


def test_an_amd_smi_before_6_3_gets_its_gfx_names_from_rocminfo(tmp_path, monkeypatch, no_kfd):
    """static without target_graphics_version, topology as 5.7 to 6.1.0 print it: the GPUs and
    links are amd-smi's (PCIE, where rocm-smi says XGMI), the gfx names rocminfo's."""
    folder = tmp_path / "bin"
    _fake_tools(folder, monkeypatch, ROCMINFO, ROCM_SMI_TOPO)
    _fake_amd_smi(folder, monkeypatch, static_json(2, gfx=None), topology_json_60("PCIE", 2))
    found = amd.gpus()
    assert [(g.gfx, g.model, g.device_id) for g in found] == [("gfx942", "MI325X", 0x74A5)] * 2
    assert amd.link_matrix(found) == [["X", "PCIE"], ["PCIE", "X"]]


def test_an_amd_smi_topology_not_understood_takes_rocm_smi_links(tmp_path, monkeypatch, no_kfd):
    folder = tmp_path / "bin"
    _fake_tools(folder, monkeypatch, ROCMINFO, ROCM_SMI_TOPO.replace("XGMI", "PCIE"))
    _fake_amd_smi(folder, monkeypatch, static_json(2), "not JSON")
    found = amd.gpus()
    assert [(g.gfx, g.model) for g in found] == [("gfx942", "MI325X")] * 2
    assert amd.link_matrix(found) == [["X", "PCIE"], ["PCIE", "X"]]


def test_the_kfd_tree_comes_before_amd_smi(tree, tmp_path, monkeypatch):
    calls = _fake_amd_smi(tmp_path / "bin", monkeypatch, static_json(2, device="0x74a1"),
                          topology_json("PCIE", 2))
    assert [g.node for g in amd.gpus()] == list(range(1, 9))
    assert not calls.exists()  # no program run


MI325X = ("gfx942", "AMD Instinct MI325X", 0x74A5)


@pytest.mark.parametrize("text, expected", [
    (static_json(), [MI325X] * 8),  # 6.3: a list, with target_graphics_version
    (json.dumps({"cpu_data": [], "core_data": [],
                 "gpu_data": [{"gpu": i, "asic": _asic(i)} for i in range(8)]}),
     [MI325X] * 8),  # 7.x: the list inside {"gpu_data": ...}
    (json.dumps({"gpu": 0, "asic": _asic(0, device="0x74a1", market="AMD Instinct MI300X",
                                         gfx=None)}),
     [("", "AMD Instinct MI300X", 0x74A1)]),  # 5.7, 6.0: one GPU's object, bare
    (json.dumps([{"gpu": i, "asic": {**_asic(i, gfx=None), "device_id": 0x74A5,
                                     "market_name": "N/A"}} for i in range(2)]),
     [("", "", 0x74A5)] * 2),  # 6.1, 6.2: no gfx; an integer id; no market name
    ("WARNING: User is missing the following required groups: render\n" + static_json(1),
     [MI325X]),  # a warning line before the JSON
], ids=["6.3-list", "7.x-gpu_data", "6.0-single-object", "6.1-no-gfx", "after-a-warning"])
def test_amd_smi_static_shapes(text, expected):
    assert amd.parse_amd_smi_gpus(text) == expected


XGMI_PAIR = [["X", "XGMI"], ["XGMI", "X"]]


@pytest.mark.parametrize("text, expected", [
    (topology_json(), [["X" if i == j else "XGMI" for j in range(8)] for i in range(8)]),
    (topology_json("PCIE", 2), [["X", "PCIE"], ["PCIE", "X"]]),  # 6.1.1 and later: links
    (topology_json_60("XGMI", 2), XGMI_PAIR),  # 5.7 to 6.1.0: link_type by "gpu_M"
    (json.dumps({"gpu_data": json.loads(topology_json("XGMI", 2))}), XGMI_PAIR),
    (topology_json("XGMI", 1), [["X"]]),
    (topology_json("XGMI", 2).replace('"gpu": 0', '"gpu": 6').replace('"gpu": 1', '"gpu": 7'),
     XGMI_PAIR),  # amd-smi -g 6 7: GPU ids not from 0
    (json.dumps([{"gpu": 0, "link_type": {"gpu_0": "SELF", "gpu_1": "N/A"}},
                 {"gpu": 1, "link_type": {"gpu_0": "N/A", "gpu_1": "SELF"}}]),
     [["X", "N/A"], ["N/A", "X"]]),  # said as printed, upper-cased
], ids=["8-xgmi", "links-pcie", "6.0-link_type", "gpu_data", "one-gpu", "ids-6-7", "n/a"])
def test_amd_smi_topology_shapes(text, expected):
    assert amd.parse_amd_smi_links(text) == expected


@pytest.mark.parametrize("text", [
    "", "garbage", "null", "42", "[1, 2]", "{", '{"gpu_data": 5}', "[[[[" * 10000,
    '[{"gpu": 0, "asic": "N/A"}]',
    json.dumps([{"gpu": 0, "bdf": BDFS[0]}]),  # neither links nor link_type
    json.dumps([{"gpu": [0], "links": []}]),
    json.dumps([{"gpu": 0, "links": [{"gpu": {"x": 1}, "link_type": "SELF"}]}]),
    json.dumps([{"gpu": 0, "link_type": {"0": "SELF"}}]),
    topology_json("XGMI", 2).replace('"link_type": "XGMI"', '"link_type": 2'),
    topology_json("XGMI", 3)[:-60],  # cut short: not JSON
    json.dumps(json.loads(topology_json("XGMI", 3))[:2]),  # 2 rows of 3 GPUs each
])
def test_amd_smi_output_not_understood_is_nothing(text):
    assert amd.parse_amd_smi_gpus(text) == [] and amd.parse_amd_smi_links(text) == []


def test_the_fingerprint_names_rccls_version_from_its_header(tmp_path, monkeypatch):
    header = tmp_path / "rocm" / "include" / "rccl" / "rccl.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 22\n#define NCCL_PATCH 3\n"
                      "#define NCCL_SUFFIX \"\"\n")
    assert amd.rccl_version(tmp_path / "rocm", roots=()) == "2.22.3"
    assert amd.rccl_version(None, roots=(tmp_path / "rocm",)) == "2.22.3"
    assert amd.rccl_version(tmp_path / "none", roots=(tmp_path / "none",)) is None
    monkeypatch.setattr(amd, "rocm_path", lambda: tmp_path / "rocm")
    monkeypatch.setattr(amd, "gpus", lambda: [])
    assert make("mi325x").fingerprint()["rccl"] == "2.22.3"
