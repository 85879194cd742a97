"""AMD GPUs as the kernel's KFD driver describes them: what is here, and how it is linked;
and `AmdPlatform`, the vendor's part of a GPU platform (HIP builds for the profile's gfx,
ROCR/HIP_VISIBLE_DEVICES, the fingerprint).

The KFD topology (`/sys/class/kfd/kfd/topology/nodes/<n>/`) is there on every machine with the
amdgpu driver, with or without ROCm's tools: each node has a `properties` file of
`name value` lines (a GPU node has a non-zero `gpu_id` file and `gfx_target_version`,
`vendor_id` 4098 = 0x1002, `device_id`, `location_id`, ...) and `io_links/<k>/properties`
(`type` 2 = PCIe, 11 = xGMI, `node_from`, `node_to`, `weight`, `min_bandwidth`,
`max_bandwidth`, in MB/s). Nothing here needs ROCm installed, and nothing runs a program.

`gfx_target_version` is major * 10000 + minor * 100 + stepping (90402: gfx942, 90010: gfx90a):
the minor and the stepping are written in hex in the gfx name.

Where the KFD tree cannot be read (a container that does not mount it), ROCm's tools say the
same: `rocminfo` (each GPU agent's gfx name and marketing name) and `rocm-smi --showtopo`
(its "Link Type between two GPUs" matrix: XGMI or PCIE). amd-smi's output is not read: its
formats have changed between ROCm releases and none could be checked here.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..build import build_hip, rocm_path
from ..profiles import PROFILES, GpuProfile
from ..tasks import Task
from .gpu import GENERIC, GpuPlatform, _run

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
AMD_VENDOR_ID = 0x1002
#: PCI device ids of the accelerators the profiles name (AMD's published ids)
DEVICE_IDS = {0x74A5: "MI325X", 0x74A1: "MI300X", 0x740C: "MI250X", 0x740F: "MI210"}
LINK_TYPES = {2: "PCIE", 11: "XGMI"}


@dataclass
class AmdGpu:
    node: int  # the KFD node number
    gpu_id: int
    gfx: str  # "gfx942"
    device_id: int
    model: str  # "MI325X", or the device id in hex where it is not known here
    location_id: int = 0  # PCI bus/device/function, as KFD packs it
    links: dict[int, tuple[str, int]] = field(default_factory=dict)  # node -> (type, weight)


def _properties(path: Path) -> dict[str, int]:
    out = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        try:
            out[name] = int(value.strip())
        except ValueError:
            continue
    return out


def gfx_name(target_version: int) -> str:
    """90402 -> 'gfx942', 90010 -> 'gfx90a', 110000 -> 'gfx1100'."""
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def kfd_gpus(nodes: Path | None = None) -> list[AmdGpu]:
    """The AMD GPUs of the KFD topology (`nodes`, else KFD_NODES), in node order, each with its
    links to the others."""
    nodes = KFD_NODES if nodes is None else nodes
    gpus = []
    if not nodes.is_dir():
        return gpus
    for node in sorted((p for p in nodes.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            gpu_id = int((node / "gpu_id").read_text().strip() or 0)
        except (OSError, ValueError):
            continue
        props = _properties(node / "properties")
        if not gpu_id or props.get("vendor_id") != AMD_VENDOR_ID:
            continue  # a CPU node, or not an AMD device
        device = props.get("device_id", 0)
        gpu = AmdGpu(int(node.name), gpu_id, gfx_name(props.get("gfx_target_version", 0)),
                     device, DEVICE_IDS.get(device, f"0x{device:04x}"),
                     props.get("location_id", 0))
        links = node / "io_links"
        for link in sorted(links.iterdir()) if links.is_dir() else ():
            lp = _properties(link / "properties")
            if "node_to" in lp:
                gpu.links[lp["node_to"]] = (LINK_TYPES.get(lp.get("type", 0), "OTHER"),
                                            lp.get("weight", 0))
        gpus.append(gpu)
    return gpus


def visible(gpus: list[AmdGpu], env: dict[str, str] | None = None) -> list[AmdGpu]:
    """The GPUs a process sees: ROCR_VISIBLE_DEVICES (the runtime's), then HIP_VISIBLE_DEVICES
    (HIP's, over what the runtime left), each a list of indices; unset: all."""
    env = os.environ if env is None else env
    seen = list(gpus)
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is None:
            continue
        picked = []
        for part in value.split(","):
            part = part.strip()
            if part.isdigit() and int(part) < len(seen) and seen[int(part)] not in picked:
                picked.append(seen[int(part)])
            else:
                break  # the runtimes stop at the first entry they cannot use
        seen = picked
    return seen


def link_matrix(gpus: list[AmdGpu]) -> list[list[str]]:
    """How each pair of GPUs is linked, in the form the topology oracle reads (X on the
    diagonal; XGMI or PCIE; SYS where KFD has no direct link between them)."""
    index = {g.node: i for i, g in enumerate(gpus)}
    out = [["SYS"] * len(gpus) for _ in gpus]
    for i, g in enumerate(gpus):
        out[i][i] = "X"
        for node, (kind, _weight) in g.links.items():
            if node in index:
                out[i][index[node]] = kind
    return out


def parse_rocminfo(text: str) -> list[tuple[str, str]]:
    """(gfx name, marketing name) of each GPU agent `rocminfo` lists, in its order."""
    found = []
    for block in re.split(r"^\*+\s*\n\s*Agent \d+\s*\n\*+\s*$", text, flags=re.M)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() not in fields:
                fields[name.strip()] = value.strip()
        if fields.get("Device Type") == "GPU" and fields.get("Name", "").startswith("gfx"):
            found.append((fields["Name"], fields.get("Marketing Name", "")))
    return found


def parse_rocm_smi_links(text: str) -> list[list[str]]:
    """The "Link Type between two GPUs" matrix of `rocm-smi --showtopo`, in the topology
    oracle's form (X on the diagonal, where rocm-smi prints 0)."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("="):
            if inside and rows:
                break
            inside = "Link Type between two GPUs" in line
            continue
        cells = line.split()
        if inside and cells and re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > 1 \
                and not re.fullmatch(r"GPU\d+", cells[1]):
            i = len(rows)
            rows.append(["X" if j == i else c.upper() for j, c in enumerate(cells[1:])])
    return rows


def tool_gpus() -> list[AmdGpu]:
    """The AMD GPUs as ROCm's tools list them (rocminfo; links from rocm-smi --showtopo)."""
    agents = parse_rocminfo(_run(["rocminfo"]))
    links = parse_rocm_smi_links(_run(["rocm-smi", "--showtopo"])) if agents else []
    gpus = []
    for i, (gfx, marketing) in enumerate(agents):
        model = next((m for m in DEVICE_IDS.values() if m in marketing), marketing or gfx)
        gpu = AmdGpu(i, i + 1, gfx, 0, model)
        if len(links) == len(agents):
            gpu.links = {j: (kind, 0) for j, kind in enumerate(links[i]) if j != i}
        gpus.append(gpu)
    return gpus


def gpus() -> list[AmdGpu]:
    """This machine's AMD GPUs: the KFD topology's, else ROCm's tools'."""
    return kfd_gpus() or tool_gpus()


def detect() -> str | None:
    """The profile name of this machine's AMD GPUs (GENERIC's where no profile names them),
    or None where there is none."""
    found = gpus()
    for gpu in found:
        for profile in PROFILES.values():
            if profile.vendor == "amd" and profile.detected and profile.model == gpu.model:
                return profile.name
    return GENERIC["amd"] if found else None


def generic_profile() -> GpuProfile | None:
    """A profile made from this machine's AMD GPUs where no profile names them (an MI300X):
    the gfx name, the GPU count, xGMI where the topology has xGMI links; None without any."""
    found = gpus()
    if not found:
        return None
    features = {"rccl", "hip-ipc"}
    if any(kind == "XGMI" for g in found for kind, _w in g.links.values()):
        features.add("xgmi")
    return GpuProfile(GENERIC["amd"], "amd", found[0].gfx, "hipcc", len(found),
                      "xgmi" if "xgmi" in features else "pcie", found[0].model,
                      frozenset(features), languages=("hip",))


class AmdPlatform(GpuPlatform):
    backend = "hip"
    VISIBLE_ENV = "HIP_VISIBLE_DEVICES"
    # NCCL's names are RCCL's: multicast stays off on every machine
    SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0"}

    def visible_gpus(self) -> int:
        """The KFD topology's (else ROCm's tools'), as ROCR/HIP_VISIBLE_DEVICES leave them."""
        return sum(1 for g in visible(gpus()) if g.model == self.profile.model)

    def tool_reason(self, task: Task, world: int) -> str | None:
        if rocm_path() is None and not shutil.which("clang++-19"):
            return "no HIP compiler (ROCm's amdclang++, or Debian's clang-19)"
        if not self.compile_only:
            return ("the ranks have no AMD device backend yet (nothing has run on an AMD GPU): "
                    "--commbench-compile-only builds each answer for "
                    f"{self.profile.arch} and stops there")
        return None

    def build(self, task: Task, source: str, cache_dir: Path):
        return build_hip(task, source, cache_dir, self.profile.arch)

    def env(self) -> dict[str, str]:
        return dict(self.SAFETY_ENV)

    def fingerprint(self) -> dict[str, Any]:
        """The AMD machine as the KFD topology and ROCm's version file say (no program run)."""
        info = super().fingerprint()
        here = visible(gpus())
        info.update({
            "gpu": f"AMD {here[0].model}" if here else "none",
            "gpu_count": len(here),
            "gfx": here[0].gfx if here else "none",
            "interconnect": self.interconnect,
            "placement": self.placement(),
        })
        for version in (Path("/opt/rocm/.info/version"), Path("/opt/rocm/.info/version-dev")):
            try:
                info["rocm"] = version.read_text().strip()
                break
            except OSError:
                continue
        if len(here) > 1:
            info["gpu0_gpu1_link"] = link_matrix(here)[0][1]
        return info
