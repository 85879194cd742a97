"""GPU platforms: the profiles of the machines the benchmark knows (`profiles`) as platforms,
and detection of this one.

A profile says what a platform is (vendor, architecture, compiler, interconnect, GPUs per
node, features). Whether this machine can run a task is decided at run time: the compiler
must exist, enough GPUs must be visible, and the task's `requires` must be among the
profile's features; otherwise the task is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..build import (
    build_cuda,
    build_hip,
    build_python,
    find_cuda_libs,
    rocm_path,
    thunderkittens_include,
)
from ..leases import lease
from ..profiles import DISTINCT, PROFILES, GpuProfile
from ..rank.protocol import ENV_RANK_CPUS
from ..tasks import Task
from . import amd
from .base import Platform

# NVLink multicast (NVLS) stays off: a program using it can take a shared host's GPUs out of
# service; every job gets these whatever the caller's environment says
SAFETY_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "NVSHMEM_DISABLE_NVLS": "1",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> list[dict[str, str]]:
    """GPUs nvidia-smi reports: name, driver, memory (empty when there is no NVIDIA GPU)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader"])
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


@functools.lru_cache(maxsize=1)
def gpu_local_cpus() -> dict[str, list[int]]:
    """For each GPU (nvidia-smi index), the CPUs of its NUMA node, from the PCI device's
    local_cpulist; GPUs whose list cannot be read are left out."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = _run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    found = {}
    for line in out.strip().splitlines():
        index, _, bus = (p.strip() for p in line.partition(","))
        # nvidia-smi says 00000000:18:00.0, sysfs 0000:18:00.0
        path = Path("/sys/bus/pci/devices") / bus.lower()[-12:] / "local_cpulist"
        try:
            found[index] = parse_cpulist(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def rank_cpus(gpu_ids: list[str], local: dict[str, list[int]], allowed: set[int],
              per_rank: int = 4) -> list[list[int]]:
    """CPUs for the rank driving each GPU: near its GPU, not shared with another rank, at most
    `per_rank` (the rank's timing thread gets the first to itself, the libraries' helper
    threads the others). CPU 0, where the kernel keeps its housekeeping (timer ticks, most
    interrupts), is used only when there are not enough others. A rank whose GPU's CPUs are
    unknown or all taken gets [] (not pinned)."""
    taken: set[int] = set()
    plan = []
    for gid in gpu_ids:
        near = [c for c in local.get(gid, []) if c in allowed and c not in taken]
        sharing = max(1, sum(1 for g in gpu_ids if local.get(g) == local.get(gid)))
        want = max(1, min(per_rank, len(local.get(gid, [])) // sharing))
        if len([c for c in near if c != 0]) >= want:
            near = [c for c in near if c != 0]
        mine = near[:want]
        taken.update(mine)
        plan.append(mine)
    return plan


@functools.lru_cache(maxsize=1)
def compute_capability() -> str:
    """The first NVIDIA GPU's compute capability ("9.0"), or "" where nvidia-smi cannot say."""
    if not shutil.which("nvidia-smi"):
        return ""
    out = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]).split()
    return out[0] if out and re.fullmatch(r"\d+\.\d+", out[0]) else ""


#: the name --platform=auto gives a GPU of a vendor's that no profile describes
GENERIC = {"nvidia": "nvidia-generic", "amd": "amd-generic"}


def generic_profile(vendor: str) -> GpuProfile | None:
    """A profile made from this machine's own GPUs where no profile of the benchmark names
    them (an H100, an MI300X...): its architecture, GPU count and links as the devices report
    them, the features every GPU of the vendor has, and those it can be seen to have (NVLink
    or xGMI links); None where the vendor has no GPU here."""
    if vendor == "nvidia":
        gpus, cc = nvidia_gpus(), compute_capability()
        if not gpus or not cc:
            return None
        arch = "sm_" + cc.replace(".", "")
        features = {"nccl", "nvshmem", "cuda-ipc", "cupy", "nvml", DISTINCT, arch}
        links = nvlink_topology()
        if len(gpus) > 1 and re.search(r"\bNV\d+\b", links):
            features.add("nvlink")
        model = gpus[0]["name"].replace("NVIDIA ", "")
        return GpuProfile(GENERIC["nvidia"], "nvidia", arch, "nvcc", len(gpus),
                          "nvlink" if "nvlink" in features else "pcie", model,
                          frozenset(features))
    found = amd.gpus()
    if vendor != "amd" or not found:
        return None
    features = {"rccl", "hip-ipc"}
    if any(kind == "XGMI" for g in found for kind, _w in g.links.values()):
        features.add("xgmi")
    return GpuProfile(GENERIC["amd"], "amd", found[0].gfx, "hipcc", len(found),
                      "xgmi" if "xgmi" in features else "pcie", found[0].model,
                      frozenset(features), languages=("hip",))


@functools.lru_cache(maxsize=1)
def nvlink_topology() -> str:
    """`nvidia-smi topo -m`, the matrix of how the GPUs are linked (NV18 = 18 NVLinks)."""
    return _run(["nvidia-smi", "topo", "-m"]).strip() if shutil.which("nvidia-smi") else ""


def detect() -> str | None:
    """The profile name of this machine's GPUs, or None."""
    gpus = nvidia_gpus()
    for gpu in gpus:
        for profile in PROFILES.values():
            if not profile.detected:
                continue
            if profile.vendor == "nvidia" and profile.model in gpu["name"].replace("NVIDIA ", ""):
                if profile.model == "H200" and "GH200" in gpu["name"]:
                    continue
                return profile.name
    for gpu in amd.gpus():
        for profile in PROFILES.values():
            if profile.vendor == "amd" and profile.model == gpu.model:
                return profile.name
    # GPUs no profile names: a profile of their own properties (`generic_profile`)
    if gpus:
        return GENERIC["nvidia"]
    if amd.gpus():
        return GENERIC["amd"]
    return None


@functools.lru_cache(maxsize=8)
def _version(argv: tuple[str, ...], pattern: str) -> str:
    m = re.search(pattern, _run(list(argv)))
    return m.group(1) if m else "unknown"


# what a job on shared GPUs gets besides its MPS daemon: NCCL over sockets on loopback (each
# rank is a "host" of its own, see the rank harness's `share_gpu`: NCCL refuses two ranks on
# one GPU otherwise); each rank's share of the SMs is set by the rank harness
SHARED_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
}
MPS_CONTROL_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")


def mps_control() -> str | None:
    """The MPS control program (PATH first, then where drivers put it)."""
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return found
    for folder in MPS_CONTROL_DIRS:
        path = Path(folder) / "nvidia-cuda-mps-control"
        if path.exists() and os.access(path, os.X_OK):
            return str(path)
    return None


def software_features() -> frozenset[str]:
    """Features that come from what is installed rather than from the GPU: PyTorch (the torch
    tasks) and the ThunderKittens headers (the ThunderKittens tasks)."""
    found = set()
    if importlib.util.find_spec("torch") is not None:
        found.add("torch")
    if thunderkittens_include() is not None:
        found.add("thunderkittens")
    return frozenset(found)


class GpuPlatform(Platform):
    backend = "cuda"
    languages = ("cuda", "python")

    def __init__(self, profile: GpuProfile) -> None:
        self.profile = profile
        self.languages = profile.languages
        if profile.vendor == "amd":
            self.backend = "hip"
        self.name = profile.name
        self.vendor = profile.vendor
        self.compiler = profile.compiler
        self.interconnect = profile.interconnect
        self.max_ranks = profile.gpus_per_node
        self.ranks_per_gpu = 1
        self.jobs_per_gpu = 1

    # -- placement --------------------------------------------------------------------------

    def place(self, ranks_per_gpu: int, jobs_per_gpu: int = 1) -> None:
        """Shared placement: up to `ranks_per_gpu` ranks on one GPU (1: a GPU per rank), and
        up to `jobs_per_gpu` untimed jobs on one GPU side by side, each under its own MPS
        daemon (a timed job always has its GPUs to itself)."""
        self.ranks_per_gpu = max(1, int(ranks_per_gpu))
        self.jobs_per_gpu = max(1, int(jobs_per_gpu)) if self.ranks_per_gpu > 1 else 1

    def gpus_for(self, world: int) -> int:
        return math.ceil(world / self.ranks_per_gpu)

    def shared(self, world: int) -> bool:
        """Do ranks of a job of `world` ranks share a GPU?"""
        return world > self.gpus_for(world)

    def placement(self) -> str:
        if self.ranks_per_gpu == 1:
            return "one GPU per rank"
        jobs = (f", up to {self.jobs_per_gpu} untimed jobs per GPU" if self.jobs_per_gpu > 1
                else "")
        return f"shared: up to {self.ranks_per_gpu} ranks per GPU, under MPS{jobs}"

    def features(self, world: int) -> frozenset[str]:
        have = self.profile.features | software_features()
        return have - {DISTINCT} if self.shared(world) else have

    def visible_gpus(self) -> int:
        if self.profile.vendor == "amd":  # the KFD topology's, as ROCR/HIP_VISIBLE_DEVICES leave them
            return sum(1 for g in amd.visible(amd.gpus()) if g.model == self.profile.model)
        if self.profile.vendor != "nvidia":
            return 0
        gpus = [g for g in nvidia_gpus() if self.profile.model in g["name"]]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return min(len(gpus), len([x for x in visible.split(",") if x.strip()]))
        return len(gpus)

    def accepts(self, task: Task) -> bool:
        """Is the task written for this platform? Where its manifest names it, or, for a
        profile --platform=auto may pick (not a variant such as h200-hip), where it names a
        platform of the same vendor: a new profile (an H100, an MI300X) takes the tasks of
        its vendor, and the task's `requires` and language say whether it can run them."""
        if self.name in task.platforms:
            return True
        if not self.profile.detected:
            return False
        return any(PROFILES[p].vendor == self.vendor and PROFILES[p].detected
                   for p in task.platforms if p in PROFILES)

    def skip_reason(self, task: Task, world: int) -> str | None:
        if not self.accepts(task):
            return f"task runs on {', '.join(task.platforms)}, not on platform {self.name}"
        if task.language not in self.languages:
            return f"platform {self.name} does not build {task.language}"
        missing = sorted(set(task.requires) - self.features(world))
        if self.compile_only:  # what the build needs, not what a run would
            missing = [m for m in missing if m in ("thunderkittens",)]
        if self.backend == "hip" and not self.compile_only:
            return ("the ranks have no AMD device backend yet (nothing has run on an AMD GPU): "
                    "--commbench-compile-only builds each answer for "
                    f"{self.profile.arch} and stops there")
        if missing == [DISTINCT]:
            return (f"needs a GPU per rank (its contract is about distinct devices); ranks "
                    f"share GPUs here (--commbench-ranks-per-gpu={self.ranks_per_gpu})")
        if "thunderkittens" in missing:
            return ("needs the ThunderKittens headers: --commbench-thunderkittens=PATH or "
                    "COMMBENCH_THUNDERKITTENS names the repository (or its include/ folder)")
        if "torch" in missing:
            return "needs PyTorch (torch.distributed with NCCL), which is not installed here"
        if missing:
            return f"platform {self.name} lacks {', '.join(missing)}"
        gpus, need = self.visible_gpus(), self.gpus_for(world)
        if gpus < need and not self.compile_only:
            hint = ("" if self.ranks_per_gpu > 1 else
                    "; --commbench-ranks-per-gpu=N places N ranks on one GPU (correctness "
                    "only)")
            return (f"needs {need} {self.profile.model} GPUs, this machine has {gpus}{hint}"
                    if gpus else f"no {self.profile.model} GPU on this machine")
        if self.vendor == "nvidia" and task.language in ("cuda", "hip") and \
                not shutil.which(self.compiler):
            return f"compiler {self.compiler} not found"
        if self.vendor == "amd" and rocm_path() is None and not shutil.which("clang++-19"):
            return "no HIP compiler (ROCm's amdclang++, or Debian's clang-19)"
        if self.shared(world) and mps_control() is None and not self.compile_only:
            return "ranks share a GPU here, and the MPS control program is not installed"
        return super().skip_reason_common(task, world)

    def build(self, task: Task, source: str, cache_dir: Path):
        if task.language == "hip" and self.profile.vendor == "amd":
            return build_hip(task, source, cache_dir, self.profile.arch)
        if task.language in ("cuda", "hip"):  # HIP on NVIDIA: through the HIP->CUDA header
            return build_cuda(task, source, cache_dir, self.profile.arch)
        return build_python(task, source, cache_dir)

    @contextlib.contextmanager
    def lease(self, world: int, exclusive: bool, whole: bool = False) -> Iterator[dict[str, str]]:
        """Lock the GPUs the job uses (all of the node's when timing exclusively) and show the
        job only its own (CUDA_VISIBLE_DEVICES). Under shared placement a job of W ranks uses
        ceil(W / ranks per GPU) GPUs, local rank r the (r // ranks per GPU)-th; with jobs per
        GPU above 1, an untimed job takes one of its GPUs' slots and a whole job all of them."""
        need = self.gpus_for(world)
        total = max(self.visible_gpus(), need)
        slots = self.jobs_per_gpu
        with lease(need, total, exclusive, slots=slots, whole=whole) as devices:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            ids = [x.strip() for x in visible.split(",")] if visible else [str(i) for i in range(total)]
            mine = [ids[d] for d in devices]
            env = {"CUDA_VISIBLE_DEVICES": ",".join(mine)}
            if self.shared(world):
                env.update(SHARED_ENV)
            per_rank = [mine[min(r // self.ranks_per_gpu, len(mine) - 1)] for r in range(world)]
            # each rank runs on CPUs of its GPU's NUMA node (the rank harness pins itself)
            # (COMMBENCH_PIN=0 leaves the placement to the launcher and the kernel)
            # (jobs side by side on a GPU are not pinned: they would all get its same CPUs)
            pin = os.environ.get("COMMBENCH_PIN", "1") != "0" and (slots == 1 or whole or exclusive)
            cpus = rank_cpus(per_rank, gpu_local_cpus(), os.sched_getaffinity(0)) if pin else []
            if any(cpus):
                env[ENV_RANK_CPUS] = ";".join(",".join(map(str, c)) for c in cpus)
            yield env

    def launch_argv(self, world: int, job: Path) -> list[str]:
        """Ranks on shared GPUs are started by the job's MPS wrapper (`rank/mps.py`), which
        runs a daemon of the job's own around the launcher."""
        argv = super().launch_argv(world, job)
        if not self.shared(world):
            return argv
        out = json.loads(Path(job).read_text())["out"]
        return [sys.executable, "-m", "commbench_rank.mps", mps_control() or
                "nvidia-cuda-mps-control", out, "--", *argv]

    def reap(self, out: Path) -> None:
        """Stop an MPS daemon a job left behind (jobs without a sandbox, whose daemon is not
        in a PID namespace that dies with the job): its pipe folder, from OUT/mps.json."""
        from ..rank.mps import stop

        try:
            fd = os.open(Path(out) / "mps.json", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return  # a FIFO or a device the job planted: never read it
                info = json.loads(f.read(4096))
        except (OSError, ValueError):
            return
        pipe = info.get("pipe") if isinstance(info, dict) else None
        if not isinstance(pipe, str) or info.get("state") == "stopped" or \
                not pipe.startswith("/tmp/mps-"):
            return
        control = mps_control()
        if control:
            stop(control, dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe), pipe)

    def nccl_lib(self) -> str | None:
        """The folder of the NCCL library the ranks load (named in the job file)."""
        folder = find_cuda_libs().nccl_lib
        return str(folder) if folder else None

    def env(self) -> dict[str, str]:
        env = dict(SAFETY_ENV)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device numbers are nvidia-smi's
        env["CUPY_TF32"] = "0"  # float32 means float32: the oracles' tolerances assume it
        libs = find_cuda_libs()
        paths = [str(p) for p in (libs.nccl_lib, libs.nvshmem_lib) if p]
        if paths:
            env["LD_LIBRARY_PATH"] = ":".join(paths + [os.environ.get("LD_LIBRARY_PATH", "")])
        return env

    def fingerprint(self) -> dict[str, Any]:
        if self.profile.vendor == "amd":
            return self._amd_fingerprint()
        info = super().fingerprint()
        gpus = nvidia_gpus()
        libs = find_cuda_libs()
        info.update({
            "gpu": gpus[0]["name"] if gpus else "none",
            "gpu_count": len(gpus),
            "driver": gpus[0]["driver"] if gpus else "none",
            "cuda": _version(("nvcc", "--version"), r"release ([\d.]+)"),
            "nccl": libs.nccl_version,
            "nvshmem": libs.nvshmem_version,
            "interconnect": self.interconnect,
            "placement": self.placement(),
        })
        if "hip" in self.languages:  # h200-hip: never to be read as an AMD result
            info["hip"] = ("through the HIP->CUDA header on this NVIDIA GPU: a check of host "
                           "logic and kernels' results, not of AMD hardware")
        topo = nvlink_topology()
        m = re.search(r"GPU0\s+X\s+(\S+)", topo)
        if m and len(gpus) > 1:  # (with one GPU the next column is its CPU affinity)
            info["gpu0_gpu1_link"] = m.group(1)
        try:
            import cupy

            info["cupy"] = cupy.__version__
        except Exception:  # noqa: BLE001 - a fingerprint never fails a run
            info["cupy"] = "missing"
        return info

    def _amd_fingerprint(self) -> dict[str, Any]:
        """The AMD machine as the KFD topology and ROCm's version file say (no program run)."""
        info = super().fingerprint()
        gpus = amd.visible(amd.gpus())
        info.update({
            "gpu": f"AMD {gpus[0].model}" if gpus else "none",
            "gpu_count": len(gpus),
            "gfx": gpus[0].gfx if gpus else "none",
            "interconnect": self.interconnect,
            "placement": self.placement(),
        })
        for version in (Path("/opt/rocm/.info/version"), Path("/opt/rocm/.info/version-dev")):
            try:
                info["rocm"] = version.read_text().strip()
                break
            except OSError:
                continue
        if len(gpus) > 1:
            info["gpu0_gpu1_link"] = amd.link_matrix(gpus)[0][1]
        return info
