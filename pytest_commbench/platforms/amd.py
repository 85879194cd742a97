"""AMD GPUs as the kernel's KFD driver describes them: what is here, and how it is linked.

The KFD topology (`/sys/class/kfd/kfd/topology/nodes/<n>/`) is there on every machine with the
amdgpu driver, with or without ROCm's tools: each node has a `properties` file of
`name value` lines (a GPU node has a non-zero `gpu_id` file and `gfx_target_version`,
`vendor_id` 4098 = 0x1002, `device_id`, `location_id`, ...) and `io_links/<k>/properties`
(`type` 2 = PCIe, 11 = xGMI, `node_from`, `node_to`, `weight`, `min_bandwidth`,
`max_bandwidth`, in MB/s). Nothing here needs ROCm installed, and nothing runs a program.

`gfx_target_version` is major * 10000 + minor * 100 + stepping (90402: gfx942, 90010: gfx90a):
the minor and the stepping are written in hex in the gfx name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

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
