"""GPU platforms, whatever their vendor: the profiles of the machines the benchmark knows
(`profiles`) as platforms. The vendors' own parts (how GPUs are found, counted, built for,
launched on and fingerprinted) are `nvidia.py` and `amd.py`; `platforms.detect` asks each.

A profile says what a platform is (vendor, architecture, compiler, interconnect, GPUs per
node, features). Whether this machine can run a task is decided at run time: the compiler
must exist, enough GPUs must be visible, and the task's `requires` must be among the
profile's features; otherwise the task is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ..leases import lease
from ..profiles import DISTINCT, PROFILES, GpuProfile
from ..rank.protocol import ENV_RANK_CPUS
from ..tasks import Task
from ..toolchains.nvidia import thunderkittens_include
from .base import Platform

#: the name --platform=auto gives a GPU of a vendor's that no profile describes
GENERIC = {"nvidia": "nvidia-generic", "amd": "amd-generic"}


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def version_line(argv: list[str]) -> str:
    """The line of a tool's version output that names its version (else its first line)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc.__class__.__name__})"
    text = (done.stdout or done.stderr).strip().splitlines()
    return next((x for x in text if "release" in x or "version" in x.lower()),
                text[0] if text else "")


def row(what: str, found: object, detail: str, missing: str) -> tuple[str, str, str]:
    """A doctor row: `detail` where `found` is truthy, else what is missing and why."""
    return (what, "found", detail) if found else (what, "missing", missing)


@functools.lru_cache(maxsize=8)
def _version(argv: tuple[str, ...], pattern: str) -> str:
    m = re.search(pattern, _run(list(argv)))
    return m.group(1) if m else "unknown"



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


def gpu_local_cpus_from(listing: str) -> dict[str, list[int]]:
    """For each GPU of `listing` (lines "index, PCI bus id"), the CPUs of its NUMA node, from
    the PCI device's local_cpulist; GPUs whose list cannot be read are left out."""
    found = {}
    for line in listing.strip().splitlines():
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


def software_features(thunderkittens: str | Path | None = None) -> frozenset[str]:
    """Features that come from what is installed rather than from the GPU: PyTorch (the torch
    tasks) and the ThunderKittens headers (the ThunderKittens tasks; `thunderkittens`: where,
    see `thunderkittens_include`)."""
    found = set()
    if importlib.util.find_spec("torch") is not None:
        found.add("torch")
    if thunderkittens_include(thunderkittens) is not None:
        found.add("thunderkittens")
    return frozenset(found)


class GpuPlatform(Platform):
    """What every GPU platform shares, whatever its vendor: a profile, shared placement,
    features, which tasks it takes and why it skips one, device leases. A vendor's platform
    (`nvidia.NvidiaPlatform`, `amd.AmdPlatform`) adds how its GPUs are found and counted,
    built for, launched on and fingerprinted: `visible_gpus`, `tool_reason`, `build`,
    `local_cpus`, `launch_argv`, `env`, `fingerprint`, and `VISIBLE_ENV`, the variable that
    shows a job its devices."""

    backend = "cuda"
    staged = True
    languages = ("cuda", "python")
    VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
    #: environment a job of ranks sharing a GPU gets (the vendor's)
    SHARED_JOB_ENV: dict[str, str] = {}

    def __init__(self, profile: GpuProfile) -> None:
        self.profile = profile
        self.languages = profile.languages
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

    def batches(self, task: Task, gpu_batch: bool) -> bool:
        """On a GPU a batch is a device buffer set, a compiled solution's context and its
        IPC mappings per call: only where --commbench-gpu-batch asks."""
        return gpu_batch

    def placement(self) -> str:
        if self.ranks_per_gpu == 1:
            return "one GPU per rank"
        jobs = (f", up to {self.jobs_per_gpu} untimed jobs per GPU" if self.jobs_per_gpu > 1
                else "")
        return f"shared: up to {self.ranks_per_gpu} ranks per GPU, under MPS{jobs}"

    def features(self, world: int) -> frozenset[str]:
        have = self.profile.features | software_features(self.thunderkittens)
        return have - {DISTINCT} if self.shared(world) else have

    def visible_gpus(self) -> int:
        """How many of the profile's GPUs this process may use (the vendor's count)."""
        return 0

    def tool_reason(self, task: Task, world: int) -> str | None:
        """Why the vendor's tools cannot build or run the item here (compiler, MPS), or None."""
        return None

    def local_cpus(self) -> dict[str, list[int]]:
        """For each GPU id, the CPUs of its NUMA node (where the vendor can say)."""
        return {}

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
        return self.tool_reason(task, world) or super().skip_reason_common(task, world)

    @contextlib.contextmanager
    def lease(self, world: int, exclusive: bool, whole: bool = False) -> Iterator[dict[str, str]]:
        """Lock the GPUs the job uses (all of the node's when timing exclusively) and show the
        job only its own (VISIBLE_ENV). Under shared placement a job of W ranks uses
        ceil(W / ranks per GPU) GPUs, local rank r the (r // ranks per GPU)-th; with jobs per
        GPU above 1, an untimed job takes one of its GPUs' slots and a whole job all of them."""
        need = self.gpus_for(world)
        total = max(self.visible_gpus(), need)
        slots = self.jobs_per_gpu
        with lease(need, total, exclusive, slots=slots, whole=whole) as devices:
            visible = os.environ.get(self.VISIBLE_ENV)
            ids = [x.strip() for x in visible.split(",")] if visible else [str(i) for i in range(total)]
            mine = [ids[d] for d in devices]
            env = {self.VISIBLE_ENV: ",".join(mine)}
            if self.shared(world):
                env.update(self.SHARED_JOB_ENV)
            per_rank = [mine[min(r // self.ranks_per_gpu, len(mine) - 1)] for r in range(world)]
            # each rank runs on CPUs of its GPU's NUMA node (the rank harness pins itself)
            # (COMMBENCH_PIN=0 leaves the placement to the launcher and the kernel)
            # (jobs side by side on a GPU are not pinned: they would all get its same CPUs)
            pin = os.environ.get("COMMBENCH_PIN", "1") != "0" and (slots == 1 or whole or exclusive)
            cpus = rank_cpus(per_rank, self.local_cpus(), os.sched_getaffinity(0)) if pin else []
            if any(cpus):
                env[ENV_RANK_CPUS] = ";".join(",".join(map(str, c)) for c in cpus)
            yield env

