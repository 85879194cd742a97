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
same, in this order:

1. `amd-smi` (ROCm's tool since 5.7): `amd-smi static --asic --json` (each GPU's
   `target_graphics_version`, `market_name` and `device_id`) and
   `amd-smi topology --link-type --json` (the link type between each pair: XGMI or PCIE).
   `amd-smi list --json` is not used: it has only bus ids, UUIDs and KFD ids.
2. Else `rocminfo` (each GPU agent's gfx name and marketing name) and `rocm-smi --showtopo`
   (its "Link Type between two GPUs" matrix: XGMI or PCIE).

Where amd-smi names the GPUs but not their gfx (releases before 6.3), rocminfo's names fill
it in when it lists as many GPUs; where amd-smi's topology is not understood, rocm-smi's is
used. A tool that is missing, exits non-zero, or prints what its parser does not understand
counts as absent.

The amd-smi shapes accepted were read from its CLI source (ROCm/amdsmi's amdsmi_cli at the
rocm-5.7.0 to rocm-6.2.2 tags and as of October 2024, and ROCm/rocm-systems' copy of the 7.x
source), not from the output of a real machine: none could be run here.

- `static --asic --json`: a list of `{"gpu": N, "asic": {...}}` (5.7 to 6.3; in 5.7 and
  6.0 one GPU's object comes without the list where there is one GPU); the list inside
  `{"gpu_data": [...], "cpu_data": [...], ...}` (7.x; not in the October 2024 source).
  `target_graphics_version` ("gfx942") is there from the October 2024 source on (6.3), not
  in 6.2.2 and before; `device_id` is a hex string ("0x74a5"), an integer is taken too.
  The October 2024 source makes the gfx name from KFD's version in decimal, which is right
  for gfx942 and gfx950 but not where the minor is 0 or a digit is hex (gfx90a, gfx1100);
  the name is taken as printed.
- `topology --link-type --json`: a list, one object per source GPU, with
  `"links": [{"gpu": M, "link_type": "XGMI"}, ...]` (6.1.1 and later) or with
  `"link_type": {"gpu_M": "XGMI", ...}` (5.7 to 6.1.0); "SELF" for a GPU and itself. The
  `{"gpu_data": [...]}` envelope is taken here too, though no source read prints topology so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..profiles import PROFILES, GpuProfile
from ..tasks import Task
from ..toolchains.amd import DEBIAN_DEVICE_LIBS, build_hip, rccl_library, rocm_path
from .base import DoctorRow
from .gpu import GENERIC, GpuPlatform, _run, version_line
from .gpu import row as doctor_row

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


def _json(text: str) -> Any:
    """The JSON document of a tool's output (after any lines of warnings before it), or None."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"^\s*[\[{]", text, flags=re.M):
        try:
            return decoder.raw_decode(text[m.end() - 1:])[0]
        except (ValueError, RecursionError):
            continue
    return None


def _amd_smi_entries(text: str) -> list[dict]:
    """The per-GPU objects of an amd-smi --json output, whichever of its shapes it has."""
    data = _json(text)
    if isinstance(data, dict):
        data = data["gpu_data"] if "gpu_data" in data else [data]
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        return []
    return data


def _hex_or_int(value: Any) -> int:
    if _is_index(value):
        return value
    try:
        return int(str(value), 0)
    except ValueError:
        return 0


def parse_amd_smi_gpus(text: str) -> list[tuple[str, str, int]]:
    """(gfx name, market name, PCI device id) of each GPU of `amd-smi static --asic --json`, in
    its order; "" and 0 for what it does not say. [] where the output is not understood."""
    found = []
    for entry in _amd_smi_entries(text):
        asic = entry.get("asic")
        if not isinstance(asic, dict):
            return []
        gfx = str(asic.get("target_graphics_version", "")).strip().lower()
        market = str(asic.get("market_name", "")).strip()
        found.append((gfx if re.fullmatch(r"gfx[0-9a-f]+", gfx) else "",
                      "" if market == "N/A" else market, _hex_or_int(asic.get("device_id"))))
    return found


def parse_amd_smi_links(text: str) -> list[list[str]]:
    """The link type between each pair of GPUs of `amd-smi topology --link-type --json`, in the
    form of parse_rocm_smi_links (X on the diagonal, where amd-smi says SELF; XGMI, PCIE, or
    what else it says, upper-cased). [] where the output is not understood."""
    entries = _amd_smi_entries(text)
    ids = [e.get("gpu", i) for i, e in enumerate(entries)]
    if not all(_is_index(i) for i in ids) or len(set(ids)) != len(ids):
        return []
    rows: list[dict[int, Any]] = []
    for entry in entries:
        links, by_key = entry.get("links"), entry.get("link_type")
        if isinstance(links, list):  # 6.1.1 and later: [{"gpu": 1, "link_type": "XGMI"}]
            if not all(isinstance(link, dict) and _is_index(link.get("gpu")) for link in links):
                return []
            rows.append({link["gpu"]: link.get("link_type") for link in links})
        elif isinstance(by_key, dict):  # 5.7 to 6.1.0: {"gpu_1": "XGMI"}
            if not all(re.fullmatch(r"gpu_\d+", key) for key in by_key):
                return []
            rows.append({int(key[4:]): kind for key, kind in by_key.items()})
        else:
            return []
    out = []
    for i, row in enumerate(rows):
        kinds = [row.get(dest) for dest in ids]
        if set(row) != set(ids) or not all(isinstance(k, str) and k for k in kinds):
            return []
        out.append(["X" if j == i else kind.upper() for j, kind in enumerate(kinds)])
    return out


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _model(device: int, name: str, gfx: str) -> str:
    return DEVICE_IDS.get(device) or next((m for m in DEVICE_IDS.values() if m in name),
                                          name or gfx)


def _tool_gpus(found: list[tuple[str, str, int]], links: list[list[str]]) -> list[AmdGpu]:
    gpus = []
    for i, (gfx, name, device) in enumerate(found):
        gpu = AmdGpu(i, i + 1, gfx, device, _model(device, name, gfx))
        if len(links) == len(found):
            gpu.links = {j: (kind, 0) for j, kind in enumerate(links[i]) if j != i}
        gpus.append(gpu)
    return gpus


def tool_gpus() -> list[AmdGpu]:
    """The AMD GPUs as ROCm's tools list them: amd-smi's (static --asic; links from
    topology --link-type), else rocminfo's (links from rocm-smi --showtopo)."""
    found = parse_amd_smi_gpus(_run(["amd-smi", "static", "--asic", "--json"]))
    if found:
        links = parse_amd_smi_links(_run(["amd-smi", "topology", "--link-type", "--json"]))
        if any(not gfx for gfx, _name, _device in found):  # amd-smi before 6.3 has no gfx
            agents = parse_rocminfo(_run(["rocminfo"]))
            if len(agents) == len(found):
                found = [(gfx or agent_gfx, name, device) for (gfx, name, device), (agent_gfx, _m)
                         in zip(found, agents)]
    else:
        found = [(gfx, name, 0) for gfx, name in parse_rocminfo(_run(["rocminfo"]))]
        links = []
    if found and len(links) != len(found):
        links = parse_rocm_smi_links(_run(["rocm-smi", "--showtopo"]))
    return _tool_gpus(found, links)


def gpus() -> list[AmdGpu]:
    """This machine's AMD GPUs: the KFD topology's, else ROCm's tools' (amd-smi, else rocminfo
    and rocm-smi)."""
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


def rccl_version(rocm: Path | None, roots: tuple[Path, ...] = (Path("/usr"),)) -> str | None:
    """RCCL's version as its header states it (NCCL's MAJOR.MINOR.PATCH, which RCCL keeps),
    from ROCm's include folder, else a distribution's; None where no RCCL header is here."""
    for root in ([rocm] if rocm else []) + list(roots):
        try:
            text = (root / "include" / "rccl" / "rccl.h").read_text(errors="replace")
        except OSError:
            continue
        parts = [re.search(rf"#define\s+NCCL_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)
    return None


def cupy_for_rocm() -> bool:
    """Whether cupy's ROCm build is installed (its wheels are named cupy-rocm-<version>), which
    the ranks' HIP backend runs on; found without importing it."""
    return any((d.metadata["Name"] or "").lower().startswith("cupy-rocm")
               for d in importlib.metadata.distributions())


def rocm_version(root: Path = Path("/opt/rocm")) -> str | None:
    """ROCm's version as its install states it (`.info/version`), None without ROCm."""
    for name in ("version", "version-dev"):
        try:
            return (root / ".info" / name).read_text().strip()
        except OSError:
            continue
    return None


def gpus_row() -> DoctorRow:
    """This machine's AMD GPUs (the KFD topology's, else ROCm's tools'), as the visibility
    variables leave them (`commbench doctor`)."""
    here = visible(gpus())
    return doctor_row("AMD GPUs", here, ", ".join(f"{g.model} ({g.gfx})" for g in here),
               "neither the KFD topology (/sys/class/kfd) nor amd-smi or rocminfo lists one")


def doctor_rows(arch: str) -> list[DoctorRow]:
    """What an AMD platform needs of the machine: GPUs, a HIP compiler with the device
    libraries for `arch`, HIP's runtime, RCCL, cupy's ROCm build (the ranks' HIP backend)."""
    rocm = rocm_path()
    out = [gpus_row()]
    version = rocm_version(rocm or Path("/opt/rocm"))
    out.append(doctor_row("ROCm", version, f"{version} ({rocm or '/opt/rocm'})",
                   "not installed: Debian's clang-19 and ROCm device libraries build instead"))
    clang = shutil.which("clang++-19")
    if rocm is not None:
        compiler = rocm / "bin" / "amdclang++"
        out.append(("HIP compiler", "found",
                    f"{compiler}: {version_line([str(compiler), '--version'])}"))
        out.append(("HIP device libraries", "found", f"ROCm's, for {arch}"))
    else:
        out.append(doctor_row("HIP compiler", clang,
                       f"{clang}: {version_line([str(clang), '--version'])} (-x hip "
                       f"--offload-arch={arch})",
                       "ROCm's amdclang++ (ROCM_PATH or /opt/rocm), or Debian's clang-19 with "
                       "clang-tools-19 and lld-19"))
        isa = DEBIAN_DEVICE_LIBS / f"oclc_isa_version_{arch[3:]}.bc"
        assemble = shutil.which("llvm-as-19")
        libs = DEBIAN_DEVICE_LIBS.is_dir() and (isa.exists() or assemble)
        out.append(doctor_row("HIP device libraries", libs,
                       f"{DEBIAN_DEVICE_LIBS} (Debian's ROCm device libraries"
                       + (")" if isa.exists() else f"; {arch}'s ISA file made with llvm-as-19)"),
                       "Debian's rocm-device-libs and llvm-19 (the bitcode the HIP build "
                       f"links for {arch}), or ROCm"))
    header = next((h for h in ([rocm / "include"] if rocm else []) + [Path("/usr/include")]
                   if (h / "hip" / "hip_runtime.h").exists()), None)
    out.append(doctor_row("HIP runtime", header, f"{header}/hip/hip_runtime.h (linked: libamdhip64)",
                   "HIP's headers and libamdhip64 (ROCm, or Debian's libamdhip64-dev)"))
    rccl, lib = rccl_version(rocm), rccl_library(rocm)
    out.append(doctor_row("RCCL", rccl and lib, f"{rccl} ({lib})",
                   "RCCL's headers and library (ROCm's rccl): without them the RCCL tasks "
                   "build against the project's declarations of its API and cannot run"))
    out.append(doctor_row("cupy for ROCm", cupy_for_rocm(), "the ranks' HIP backend",
                   "a cupy-rocm-* package: the ranks' buffers, streams and IPC on AMD GPUs "
                   "(without it, items are skipped saying so)"))
    return out


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
        if self.compile_only:
            return None
        if not cupy_for_rocm():
            return ("the ranks' HIP backend needs cupy's ROCm build (a cupy-rocm-* package), "
                    "and none is installed: --commbench-compile-only builds each answer for "
                    f"{self.profile.arch} and stops there")
        if self.shared(world):
            return ("ranks sharing an AMD GPU were never tried (AMD has no MPS): "
                    "--commbench-ranks-per-gpu=1 gives each rank a GPU of its own")
        return None

    def build(self, task: Task, source: str, cache_dir: Path):
        return build_hip(task, source, cache_dir, self.profile.arch)

    def doctor_rows(self) -> list[DoctorRow]:
        return doctor_rows(self.profile.arch)

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
        rocm = rocm_version()
        if rocm:
            info["rocm"] = rocm
        if len(here) > 1:
            info["gpu0_gpu1_link"] = link_matrix(here)[0][1]
        rccl = rccl_version(rocm_path())
        if rccl:
            info["rccl"] = rccl
        return info
