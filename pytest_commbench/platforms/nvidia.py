"""NVIDIA GPUs: how they are found (nvidia-smi), counted (CUDA_VISIBLE_DEVICES), linked
(`nvidia-smi topo -m`), built for (nvcc, CUDA and HIP through the HIP->CUDA header), shared
(MPS) and fingerprinted: `NvidiaPlatform`, the vendor's part of a GPU platform."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from ..build import build_python
from ..cupti_guard import find_cupti
from ..profiles import DISTINCT, PROFILES, GpuProfile
from ..rank.protocol import SANITIZER_EXIT, SANITIZER_LOG
from ..tasks import Task
from ..toolchains.nvidia import build_cuda, cuda_runtime_dir, find_cuda_libs
from .base import DoctorRow
from .gpu import GENERIC, GpuPlatform, _run, _version, gpu_local_cpus_from, row, version_line

# NVLink multicast (NVLS) stays off: a program using it can take a shared host's GPUs out of
# service; every job gets these whatever the caller's environment says
SAFETY_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "NVSHMEM_DISABLE_NVLS": "1",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}


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


@functools.lru_cache(maxsize=1)
def compute_capability() -> str:
    """The first NVIDIA GPU's compute capability ("9.0"), or "" where nvidia-smi cannot say."""
    if not shutil.which("nvidia-smi"):
        return ""
    out = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]).split()
    return out[0] if out and re.fullmatch(r"\d+\.\d+", out[0]) else ""


def generic_profile() -> GpuProfile | None:
    """A profile made from this machine's NVIDIA GPUs where no profile of the benchmark names
    them (an H100...): the compute capability's architecture, the GPU count, NVLink where
    `nvidia-smi topo -m` shows NV links, and what every NVIDIA GPU here has; None where there
    is none."""
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


@functools.lru_cache(maxsize=1)
def nvlink_topology() -> str:
    """`nvidia-smi topo -m`, the matrix of how the GPUs are linked (NV18 = 18 NVLinks)."""
    return _run(["nvidia-smi", "topo", "-m"]).strip() if shutil.which("nvidia-smi") else ""


def detect() -> str | None:
    """The profile name of this machine's NVIDIA GPUs (GENERIC's where no profile names
    them), or None where there is none."""
    gpus = nvidia_gpus()
    for gpu in gpus:
        for profile in PROFILES.values():
            if not profile.detected:
                continue
            if profile.vendor == "nvidia" and profile.model in gpu["name"].replace("NVIDIA ", ""):
                if profile.model == "H200" and "GH200" in gpu["name"]:
                    continue
                return profile.name
    return GENERIC["nvidia"] if gpus else None


# what a job on shared GPUs gets besides its MPS daemon: NCCL over sockets on loopback (each
# rank is a "host" of its own, see the rank harness's `share_gpu`: NCCL refuses two ranks on
# one GPU otherwise); each rank's share of the SMs is set by the rank harness
SHARED_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
}
MPS_CONTROL_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")


def compute_sanitizer() -> str | None:
    """NVIDIA's compute-sanitizer: on PATH, else beside the nvcc found, else in the toolkit's
    usual places."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    places = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = Path(nvcc).resolve().parent.parent
        places += [root / "bin" / "compute-sanitizer",
                   root / "compute-sanitizer" / "compute-sanitizer"]
    places += [Path("/usr/local/cuda/bin/compute-sanitizer"),
               Path("/usr/local/cuda/compute-sanitizer/compute-sanitizer")]
    return next((str(p) for p in places if p.is_file() and os.access(p, os.X_OK)), None)


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



@functools.lru_cache(maxsize=1)
def gpu_local_cpus() -> dict[str, list[int]]:
    """For each GPU (nvidia-smi index), the CPUs of its NUMA node, from the PCI device's
    local_cpulist; GPUs whose list cannot be read are left out."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = _run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    return gpu_local_cpus_from(out)


def _package(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpus_row() -> DoctorRow:
    """This machine's NVIDIA GPUs as nvidia-smi lists them (`commbench doctor`)."""
    gpus = nvidia_gpus()
    return row("NVIDIA GPUs", gpus, ", ".join(g.get("name", "?") for g in gpus),
               "nvidia-smi lists none")


def doctor_rows(compiler: str = "nvcc") -> list[DoctorRow]:
    """What an NVIDIA platform needs of the machine: GPUs and driver, nvcc, the CUDA runtime,
    NCCL, NVSHMEM, CUPTI and (for shared placement) the MPS control program."""
    gpus = nvidia_gpus()
    out = [gpus_row()]
    if gpus:
        out.append(("driver", "found", gpus[0].get("driver", "")))
    nvcc = shutil.which(compiler)
    out.append(row(compiler, nvcc, f"{nvcc}: {version_line([str(nvcc), '--version'])}",
                   "the CUDA toolkit's compiler, for the CUDA tasks"))
    runtime = cuda_runtime_dir()
    out.append(row("CUDA runtime", runtime, str(runtime), "libcudart"))
    libs = find_cuda_libs()
    out.append(row("NCCL", libs.nccl_include, f"{libs.nccl_version} ({libs.nccl_include})",
                   "headers and library (pip install -e '.[gpu]' brings nvidia-nccl-cu13)"))
    out.append(row("NVSHMEM", libs.nvshmem_include,
                   f"{libs.nvshmem_version} ({libs.nvshmem_include})",
                   "headers and library (nvidia-nvshmem-cu13)"))
    cupy = next(filter(None, map(_package, ("cupy-cuda13x", "cupy"))), None)
    out.append(row("cupy-cuda13x", cupy, str(cupy),
                   "CuPy tasks and the ranks' GPU buffers (pip install -e '.[gpu]')"))
    out.append(row("CUPTI", find_cupti(), "the run-time guard of CUDA tasks",
                   "without it, forbidden CUDA calls are checked by symbol only"))
    control = mps_control()
    out.append(row("MPS control", control, str(control),
                   "needed only with --commbench-ranks-per-gpu"))
    return out


class NvidiaPlatform(GpuPlatform):
    backend = "cuda"
    cuda_api = True
    SHARED_JOB_ENV = SHARED_ENV

    def visible_gpus(self) -> int:
        gpus = [g for g in nvidia_gpus() if self.profile.model in g["name"]]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return min(len(gpus), len([x for x in visible.split(",") if x.strip()]))
        return len(gpus)

    def tool_reason(self, task: Task, world: int) -> str | None:
        if task.language in ("cuda", "hip") and not shutil.which(self.compiler):
            return f"compiler {self.compiler} not found"
        if self.shared(world) and mps_control() is None and not self.compile_only:
            return "ranks share a GPU here, and the MPS control program is not installed"
        return None

    def local_cpus(self) -> dict[str, list[int]]:
        return gpu_local_cpus()

    def doctor_rows(self) -> list[DoctorRow]:
        return doctor_rows(self.compiler)

    def build(self, task: Task, source: str, cache_dir: Path):
        if task.language in ("cuda", "hip"):  # HIP on NVIDIA: through the HIP->CUDA header
            return build_cuda(task, source, cache_dir, self.profile.arch, self.thunderkittens)
        return build_python(task, source, cache_dir)

    def wraps_launcher(self, world: int) -> bool:
        return self.shared(world)  # the MPS wrapper (launch_argv)

    def launch_argv(self, world: int, job: Path, wrap: tuple[str, ...] = (),
                    nodes: list[str] | None = None) -> list[str]:
        """Ranks on shared GPUs are started by the job's MPS wrapper (`rank/mps.py`), which
        runs a daemon of the job's own around the launcher."""
        argv = super().launch_argv(world, job, wrap, nodes)
        if not self.shared(world):
            return argv
        out = json.loads(Path(job).read_text())["out"]
        return [sys.executable, "-m", "commbench_rank.mps", mps_control() or
                "nvidia-cuda-mps-control", out, "--", *argv]

    def sanitizer(self, tool: str, out: Path) -> tuple[str, ...] | None:
        """compute-sanitizer with `tool` around a rank: every finding in the rank's own log
        (Open MPI's rank variable names it), and the rank's exit status SANITIZER_EXIT when
        there was any."""
        path = compute_sanitizer()
        if path is None:
            return None
        return (path, "--tool", tool, "--error-exitcode", str(SANITIZER_EXIT),
                "--print-limit", "20", "--log-file",
                str(Path(out) / SANITIZER_LOG.format(rank="%q{OMPI_COMM_WORLD_RANK}")))

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

